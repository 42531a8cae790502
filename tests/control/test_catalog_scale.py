"""A model's scaling policy in the catalog: carried by every reload, never in the fingerprint.

Catalogs are built from real server.yaml files, as the server loads them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.config.scale import Scale
from llmgw.config.server import load_server_config
from llmgw.control.catalog import Catalog

SERVER_YAML = """\
listen: {link: "ssl:7443"}
tls: {ca: ca.crt, cert: server.crt, key: server.key}
profiles:
  sim-fast: {engine: sim, args: ["--ttft-ms", "0"], scale: {priority: 1}}
models:
  qwen: {profile: sim-fast, replicas: {min: 0, max: 3}, scale: {idle_s: 600}}
  echo: {profile: sim-fast, replicas: 2}
"""


@pytest.fixture
def server_yaml(tmp_path: Path) -> Path:
    for name in ("ca.crt", "server.crt", "server.key"):
        (tmp_path / name).write_text("")
    path = tmp_path / "server.yaml"
    path.write_text(SERVER_YAML)
    return path


def test_each_entry_carries_its_models_resolved_policy(server_yaml: Path) -> None:
    catalog = Catalog(load_server_config(server_yaml))
    assert catalog.entries["qwen"].model.scale == Scale(min=0, max=3, idle_s=600.0, priority=1)
    assert catalog.entries["echo"].model.scale == Scale(min=2, max=2, priority=1)


@pytest.mark.parametrize("old, new, says", [
    ("scale: {idle_s: 600}", "scale: {idle_s: 900, target_inflight: 2}",
     "model qwen's scale changed: idle_s 600 to 900, target_inflight 4 to 2"),
    ("{min: 0, max: 3}", "{min: 1, max: 3}", "model qwen's scale changed: min 0 to 1"),
    # A profile's defaults are told in the lines of its models, not as a change of the profile.
    ("scale: {priority: 1}", "scale: {priority: 2, idle_s: 60}", None),
])
def test_a_reload_of_a_policy_alone_says_what_moved_and_restarts_nothing(server_yaml: Path, old, new, says) -> None:
    catalog = Catalog(load_server_config(server_yaml))
    before = {name: entry.fingerprint for name, entry in catalog.entries.items()}
    server_yaml.write_text(SERVER_YAML.replace(old, new))
    changes = catalog.reload()
    if says is None:
        assert changes == ["model echo's scale changed: priority 1 to 2",
                           "model qwen's scale changed: priority 1 to 2"]
        # A fixed count takes only the priority of its profile's keys; qwen's own idle_s wins over the profile's.
        assert catalog.entries["echo"].model.scale == Scale(min=2, max=2, priority=2)
        assert catalog.entries["qwen"].model.scale.idle_s == 600.0
    else:
        assert changes == [says]
    assert catalog.entries["qwen"].model.scale == load_server_config(server_yaml).models["qwen"].scale
    # The fingerprint is what makes a running replica stale: a policy never does.
    assert {name: entry.fingerprint for name, entry in catalog.entries.items()} == before


def test_a_profile_key_a_model_does_not_take_is_said_to_change_nothing(server_yaml: Path) -> None:
    catalog = Catalog(load_server_config(server_yaml))
    server_yaml.write_text(SERVER_YAML.replace("scale: {priority: 1}", "scale: {priority: 1, up_after_s: 3}"))
    assert catalog.reload() == [
        "model echo unchanged: its count is fixed, and the keys of profile sim-fast's scale that changed apply "
        "only to one that can move",
        "model qwen's scale changed: up_after_s 10 to 3",
    ]
    server_yaml.write_text(SERVER_YAML.replace("scale: {priority: 1}", "scale: {priority: 1, up_after_s: 3, idle_s: 5}"))
    assert catalog.reload() == [
        "model echo unchanged: its count is fixed, and the keys of profile sim-fast's scale that changed apply "
        "only to one that can move",
        "model qwen unchanged: its own scale keys stand over those of profile sim-fast that changed",
    ]


def test_a_new_max_or_a_count_that_turns_elastic_is_a_change_of_the_model(server_yaml: Path) -> None:
    catalog = Catalog(load_server_config(server_yaml))
    before = catalog.entries["echo"].fingerprint
    server_yaml.write_text(SERVER_YAML.replace("replicas: 2", "replicas: {min: 0, max: 4}"))
    assert catalog.reload() == ["model echo changed"]
    assert catalog.entries["echo"].model.replicas == 4
    assert catalog.entries["echo"].fingerprint == before
    # The same count written as a range is no change at all.
    server_yaml.write_text(SERVER_YAML.replace("replicas: 2", "replicas: {min: 2, max: 2}"))
    catalog.reload()
    server_yaml.write_text(SERVER_YAML)
    assert catalog.reload() == []
