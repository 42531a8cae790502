"""Downloads and installs, weights per fabric, and certificate expiry: read from a real fleet and real files."""

from __future__ import annotations

import datetime

import pytest
from prometheus_client import CollectorRegistry

from llmgw import pki as pkimod
from llmgw.control.collector import DownloadFailures, FleetCollector, WeightsCollector
from llmgw.control.fleet import Fleet
from llmgw.link.metrics import CertificateCollector
from llmgw.records import IBAdapter, Inventory, Progress, WeightsFile, WeightsReport
from tests.support.reportedfleet import GIB, clock  # noqa: F401 - the fixture, by name


def value(registry, name, /, **labels):
    return registry.get_sample_value(name, labels)


@pytest.fixture
def failures():
    return []  # the DownloadFailures the fleet's events go to, once made


@pytest.fixture
def fleet(clock, failures):
    fleet = Fleet(clock, lambda kind, ident, event: [f.observe(kind, ident, event) for f in failures])
    fleet.register("gpu01", 1, Inventory(node_id="gpu01"), certificate_not_after=2_000_000_000.0)
    fleet.register("cpu07", 2, Inventory(node_id="cpu07"))
    return fleet


@pytest.fixture
def registry(fleet, clock, failures):
    registry = CollectorRegistry()
    registry.register(FleetCollector(fleet, clock))
    failures.append(DownloadFailures(fleet))
    registry.register(failures[0])
    return registry


def test_downloads_and_installs_in_progress_by_node_and_kind(fleet, registry):
    fleet.download("gpu01", Progress(source="hf://org/model", file_name="model.safetensors", bytes_done=3 * GIB,
                                     bytes_total=10 * GIB))
    fleet.download("gpu01", Progress(source="https://mirror/llama-b6000.zip", file_name="llama.zip", bytes_done=5))
    fleet.download("gpu01", Progress(source="pip:vllm==0.6.3", file_name="vllm==0.6.3", bytes_done=700))
    assert value(registry, "llmgw_downloads_active", node="gpu01", kind="download") == 2
    assert value(registry, "llmgw_downloads_active", node="gpu01", kind="install") == 1
    assert value(registry, "llmgw_download_bytes", node="gpu01", kind="download") == 3 * GIB + 5
    # Only the download that knows its size adds to the size.
    assert value(registry, "llmgw_download_size_bytes", node="gpu01", kind="download") == 10 * GIB
    assert value(registry, "llmgw_download_size_bytes", node="gpu01", kind="install") is None
    # A node showing none has no series: absent, summed with `or vector(0)`.
    assert value(registry, "llmgw_downloads_active", node="cpu07", kind="download") is None
    fleet.download("gpu01", Progress(source="hf://org/model", file_name="model.safetensors", bytes_done=10 * GIB,
                                     bytes_total=10 * GIB, final=True))
    assert value(registry, "llmgw_downloads_active", node="gpu01", kind="download") == 1


def test_a_report_that_overran_its_own_size_counts_its_bytes_not_its_size(fleet, registry):
    fleet.download("cpu07", Progress(source="hf://org/model", file_name="f", bytes_done=9 * GIB, bytes_total=1 * GIB))
    assert value(registry, "llmgw_download_bytes", node="cpu07", kind="download") == 9 * GIB
    assert value(registry, "llmgw_download_size_bytes", node="cpu07", kind="download") is None


def test_failed_downloads_and_installs_are_counted_from_the_fleets_events(fleet, registry):
    assert value(registry, "llmgw_download_failures_total", node="gpu01", kind="download") is None
    for _ in range(2):
        fleet.download("gpu01", Progress(source="hf://org/model", file_name="f", bytes_done=1, final=True,
                                         error="the server answered 404"))
    fleet.download("gpu01", Progress(source="pip:vllm", file_name="vllm", bytes_done=0, final=True, error="no wheel"))
    fleet.download("gpu01", Progress(source="hf://org/other", file_name="f", bytes_done=1, final=True))
    assert value(registry, "llmgw_download_failures_total", node="gpu01", kind="download") == 2
    assert value(registry, "llmgw_download_failures_total", node="gpu01", kind="install") == 1
    # A node the fleet no longer has (offboarded) takes its count with it.
    del fleet.nodes["gpu01"]
    assert value(registry, "llmgw_download_failures_total", node="gpu01", kind="download") is None


def test_a_nodes_certificate_expiry_is_a_timestamp_and_absent_when_not_known(registry):
    assert value(registry, "llmgw_node_certificate_expiry_timestamp_seconds", node="gpu01") == 2_000_000_000.0
    assert value(registry, "llmgw_node_certificate_expiry_timestamp_seconds", node="cpu07") is None


def test_weights_held_per_fabric_and_a_model_nobody_holds(clock):
    def holding(node_id: str, fabric: str | None) -> Inventory:
        return Inventory(node_id=node_id, infiniband=[IBAdapter(name="mlx5_0", fabric=fabric)] if fabric else None,
                         weights=WeightsReport(files=[WeightsFile(path="/srv/models/qwen.gguf", size_bytes=GIB)],
                                               listed=True))

    fleet = Fleet(clock, lambda *event: None)
    fleet.register("a1", 1, holding("a1", "ib-a"))
    fleet.register("a2", 2, holding("a2", "ib-a"))
    fleet.register("e1", 3, holding("e1", None))
    registry = CollectorRegistry()
    sources = {"qwen": ("/srv/models/qwen.gguf", ()), "gemma": ("/srv/models/gemma.gguf", ()), "remote": (None, ())}
    registry.register(WeightsCollector(fleet, lambda: sources))
    assert value(registry, "llmgw_weights_held_nodes", model="qwen", fabric="ib-a") == 2
    assert value(registry, "llmgw_weights_held_nodes", model="qwen", fabric="-") == 1
    assert value(registry, "llmgw_weights_held_nodes", model="gemma", fabric="-") == 0
    assert not [s for f in registry.collect() for s in f.samples if s.labels.get("model") == "remote"]


def test_the_servers_certificates_expiry_is_read_from_their_files_and_a_renewal_is_seen(tmp_path):
    ca = tmp_path / "pki"
    pkimod.init_ca(ca, name="expiry")
    pkimod.issue(ca, "llmgw-server", "server", sans=("127.0.0.1",), days=10)
    registry = CollectorRegistry()
    registry.register(CertificateCollector({"server": ca / "llmgw-server.crt", "ca": ca / "ca.crt",
                                            "missing": tmp_path / "nothing.crt"}))
    in_ten_days = datetime.datetime.now(datetime.timezone.utc).timestamp() + 10 * 86400
    assert value(registry, "llmgw_certificate_expiry_timestamp_seconds", certificate="server") == \
        pytest.approx(in_ten_days, abs=3600)
    assert value(registry, "llmgw_certificate_expiry_timestamp_seconds", certificate="ca") > in_ten_days
    assert value(registry, "llmgw_certificate_expiry_timestamp_seconds", certificate="missing") is None
    pkimod.issue(ca, "llmgw-server", "server", sans=("127.0.0.1",), days=300, force=True)
    assert value(registry, "llmgw_certificate_expiry_timestamp_seconds", certificate="server") == \
        pytest.approx(in_ten_days + 290 * 86400, abs=3600)
    (ca / "llmgw-server.crt").write_bytes(b"not a certificate at all")
    assert value(registry, "llmgw_certificate_expiry_timestamp_seconds", certificate="server") is None


def test_progress_beyond_a_nodes_download_cap_is_counted_refused_and_not_shown(fleet, registry):
    from llmgw.control.fleet import TooManyDownloads

    fleet.configure(fleet.news, downloads_per_node=2)
    refused = 0
    for i in range(5):
        try:
            fleet.download("cpu07", Progress(source=f"hf://org/m{i}", file_name="f", bytes_done=i))
        except TooManyDownloads:
            refused += 1
    assert refused == 3
    assert value(registry, "llmgw_node_progress_refused_total", node="cpu07") == 3
    assert value(registry, "llmgw_downloads_active", node="cpu07", kind="download") == 2


def test_a_shard_a_node_was_never_given_is_counted_refused(fleet, registry):
    from llmgw.control.claims import ClaimRefused
    from llmgw.records import ShardSpec, ShardStatus

    assert value(registry, "llmgw_node_claims_refused_total", node="cpu07", reason="not placed") is None
    spec = ShardSpec(shard_id="qwen/0/0", replica_id="qwen/0", model="qwen", engine="vllm")
    with pytest.raises(ClaimRefused):
        fleet.shard_status("cpu07", ShardStatus(spec=spec, state="ready", since=0.0))
    assert value(registry, "llmgw_node_claims_refused_total", node="cpu07", reason="not placed") == 1
