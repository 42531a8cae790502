"""server.yaml files that are right: what the server gets from them."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from llmgw.config import (
    Admission,
    APIKey,
    Engine,
    Engines,
    FleetSettings,
    Listen,
    Model,
    Profile,
    RouterSettings,
    TLSFiles,
    load_server_config,
)

TLS = "tls: {ca: ca.crt, cert: server.crt, key: server.key}\n"

# The example in ARCHITECTURE.md, verbatim apart from the TLS paths and the
# llama.cpp release: it names b6000, and a release llmgw ships no digests for
# is refused unless server.yaml gives them.
ARCHITECTURE_EXAMPLE = """\
listen:
  link: "ssl:7443"                          # the hub, mutual TLS
  api: "tcp:8080:interface=127.0.0.1"       # OpenAI router
  admin: "tcp:9090:interface=127.0.0.1"     # /metrics, /admin
tls: {ca: pki/ca.crt, cert: pki/server.crt, key: pki/server.key}
engines:
  llama.cpp: {version: "b11194"}
profiles:
  gemma-cpu: {engine: llama.cpp, args: ["-c", "4096"], min_memory_gb: 2}
  sim-fast:  {engine: sim, args: ["--ttft-ms", "0"]}
models:
  gemma-3-270m: {source: /srv/models/gemma-3-270m-q4_k_m.gguf, profile: gemma-cpu, replicas: 1}
  echo:         {profile: sim-fast, replicas: 2}            # sim needs no weights
router:
  admission: {max_inflight_per_endpoint: 16, queue: 256, queue_timeout_s: 30}
  scoring: prefix-affinity
"""


def test_a_minimal_file_gets_every_default(confdir: Path) -> None:
    (confdir / "server.yaml").write_text('listen: {link: "ssl:7443"}\n' + TLS)
    config = load_server_config("server.yaml")
    assert config.path == str(confdir / "server.yaml")
    assert config.listen == Listen(
        link="ssl:7443",
        api="tcp:8080:interface=127.0.0.1",
        admin="tcp:9090:interface=127.0.0.1",
    )
    assert config.fleet == FleetSettings(unreachable_after_s=15.0, lost_after_s=120.0)
    assert config.engines == Engines(builds={"llama.cpp": Engine(name="llama.cpp", version="b11194")})
    assert config.profiles == {}
    assert config.models == {}
    assert config.router == RouterSettings(
        admission=Admission(max_inflight_per_endpoint=16, queue=256, queue_timeout_s=30.0),
        scoring="least-outstanding",
        allow_anonymous=False,
        max_body_bytes=4 * 1024 * 1024,
        keys=(),
    )


def test_the_architecture_example_loads(confdir: Path) -> None:
    (confdir / "pki").mkdir()
    for name in ("ca.crt", "server.crt", "server.key"):
        (confdir / "pki" / name).write_text("")
    (confdir / "server.yaml").write_text(ARCHITECTURE_EXAMPLE)
    config = load_server_config("server.yaml")
    assert config.profiles["gemma-cpu"] == Profile(
        name="gemma-cpu", engine="llama.cpp", args=("-c", "4096"), min_memory_gb=2.0
    )
    assert config.profiles["sim-fast"].args == ("--ttft-ms", "0")
    assert config.models["echo"] == Model(name="echo", profile="sim-fast", source=None, replicas=2)
    assert config.models["gemma-3-270m"].source == "/srv/models/gemma-3-270m-q4_k_m.gguf"
    assert config.router.scoring == "prefix-affinity"
    assert config.tls == TLSFiles(
        ca=str(confdir / "pki/ca.crt"),
        cert=str(confdir / "pki/server.crt"),
        key=str(confdir / "pki/server.key"),
    )


def test_relative_tls_paths_are_read_from_the_config_files_directory(
    confdir: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """twistd may start anywhere; the paths must not depend on the working directory."""
    etc = confdir / "etc"
    etc.mkdir()
    (etc / "server.yaml").write_text(
        'listen: {link: "ssl:7443"}\ntls: {ca: ../ca.crt, cert: ../server.crt, key: ../server.key}\n'
    )
    monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))
    config = load_server_config(etc / "server.yaml")
    assert config.tls.ca == str(confdir / "ca.crt")
    assert config.tls.key == str(confdir / "server.key")


def test_everything_that_can_be_written(confdir: Path) -> None:
    (confdir / "server.yaml").write_text(
        """\
listen:
  link: "ssl:port=7443:interface=0.0.0.0"
  api: "unix:/run/llmgw/api.sock:mode=660"
  admin: null                       # no admin listener at all
tls: {ca: ca.crt, cert: server.crt, key: server.key}
fleet: {unreachable_after_s: 2.5, lost_after_s: 60}
engines:
  install_os_packages: true
  vllm: {version: "0.10.1", pip: "vllm[audio]==0.10.1", index_url: "https://pypi.mirror.example/simple"}
  sglang: {python: /opt/sglang/bin/python}
  llama.cpp:
    version: b6100
    base_url: https://mirror.example.org/llama.cpp
    sha256: {llama-b6100-bin-ubuntu-x64.tar.gz: 9F86D081884C7D659A2FEAA0C55AD015A3BF4F1B2B0B822CD15D6C15B0F00A08}
profiles:
  llama-70b:
    engine: vllm
    args: [--max-model-len, "8192"]
    gpus: 8
    min_memory_gb: 64.5
    node_selector: {fabric: ib-a, "gpu.vendor": nvidia}
    ranks: 2
models:
  llama-3.3-70b:
    source: https://mirror.example.org/llama-3.3-70b/
    profile: llama-70b
    replicas: 0
    sha256: 9F86D081884C7D659A2FEAA0C55AD015A3BF4F1B2B0B822CD15D6C15B0F00A08
router:
  scoring: engine-load
  allow_anonymous: yes
  max_body_bytes: 1048576
  keys:
    - name: ci
      sha256: 2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae
      models: [llama-3.3-70b]
      requests_per_minute: 60
      tokens_per_minute: 100000
    - name: ops
      sha256: fcde2b2edba56bf408601fb721fe9b5c338d10ee429ea04fae5511b68fbf8fb9
"""
    )
    config = load_server_config("server.yaml")
    assert config.listen.admin is None
    assert config.listen.api == "unix:/run/llmgw/api.sock:mode=660"
    assert config.listen.link_endpoint.port == 7443
    assert config.listen.link_endpoint.interface == "0.0.0.0"
    assert config.fleet == FleetSettings(unreachable_after_s=2.5, lost_after_s=60.0)
    assert set(config.engines.builds) == {"vllm", "sglang", "llama.cpp"}
    assert config.engines.install_os_packages is True
    assert config.engines.get("llama.cpp") == Engine(
        name="llama.cpp", version="b6100", base_url="https://mirror.example.org/llama.cpp",
        sha256={"llama-b6100-bin-ubuntu-x64.tar.gz": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"},
    )
    assert config.engines.get("vllm") == Engine(
        name="vllm", version="0.10.1", pip="vllm[audio]==0.10.1", index_url="https://pypi.mirror.example/simple",
    )
    assert config.engines.get("sglang") == Engine(name="sglang", python="/opt/sglang/bin/python")
    assert config.profiles["llama-70b"] == Profile(
        name="llama-70b",
        engine="vllm",
        args=("--max-model-len", "8192"),
        gpus=8,
        min_memory_gb=64.5,
        node_selector={"fabric": "ib-a", "gpu.vendor": "nvidia"},
        ranks=2,
    )
    model = config.models["llama-3.3-70b"]
    assert model.replicas == 0
    # Hashes are compared as text later; one spelling avoids a false mismatch.
    assert model.sha256 == "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
    assert config.router.allow_anonymous is True
    assert config.router.keys == (
        APIKey(
            name="ci",
            sha256="2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae",
            models=("llama-3.3-70b",),
            requests_per_minute=60,
            tokens_per_minute=100000,
        ),
        APIKey(
            name="ops",
            sha256="fcde2b2edba56bf408601fb721fe9b5c338d10ee429ea04fae5511b68fbf8fb9",
        ),
    )
    assert config.router.keys[1].models is None


def test_sections_left_empty_take_their_defaults(confdir: Path) -> None:
    """``router:`` with everything under it commented out is not an error."""
    (confdir / "server.yaml").write_text(
        'listen: {link: "ssl:7443"}\n' + TLS + "router:\n#  scoring: engine-load\nmodels:\n"
    )
    config = load_server_config("server.yaml")
    assert config.router == RouterSettings()
    assert config.models == {}


def test_merge_keys_share_settings_and_explicit_keys_win(confdir: Path) -> None:
    (confdir / "server.yaml").write_text(
        'listen: {link: "ssl:7443"}\n'
        + TLS
        + """\
profiles:
  base: &base {engine: vllm, gpus: 1, args: [--enforce-eager]}
  big:
    <<: *base
    gpus: 4
"""
    )
    config = load_server_config("server.yaml")
    assert config.profiles["big"] == Profile(
        name="big", engine="vllm", args=("--enforce-eager",), gpus=4
    )


def test_values_are_frozen(confdir: Path) -> None:
    (confdir / "server.yaml").write_text('listen: {link: "ssl:7443"}\n' + TLS)
    config = load_server_config("server.yaml")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        config.router.scoring = "engine-load"  # type: ignore[misc]
    assert isinstance(config.router.keys, tuple)
