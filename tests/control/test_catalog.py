"""The catalog: what server.yaml asks for, each model's fingerprint, and what a reload changes.

Catalogs are built from real server.yaml files, loaded as the server loads
them; the TLS files they name are empty, since loading only checks that
they exist.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from llmgw.config.catalog import Model, Profile
from llmgw.config.server import load_server_config
from llmgw.control.catalog import Catalog, check_profiles, entries, fingerprint
from llmgw.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
SHA = "ab" * 32

HEAD = """\
listen: {link: "ssl:7443"}
tls: {ca: ca.crt, cert: server.crt, key: server.key}
"""

SERVER_YAML = HEAD + """\
profiles:
  gemma-cpu: {engine: llama.cpp, args: ["-c", "4096"], min_memory_gb: 2}
  sim-fast: {engine: sim, args: ["--ttft-ms", "0"]}
models:
  gemma: {source: /srv/models/gemma.gguf, profile: gemma-cpu}
  echo: {profile: sim-fast, replicas: 2}
"""


@pytest.fixture
def server_yaml(tmp_path: Path) -> Path:
    for name in ("ca.crt", "server.crt", "server.key"):
        (tmp_path / name).write_text("")
    path = tmp_path / "server.yaml"
    path.write_text(SERVER_YAML)
    return path


# -- fingerprints --

MODEL = Model(name="gemma", profile="gemma-cpu", source="/srv/models/gemma.gguf", replicas=1, sha256=SHA)
PROFILE = Profile(name="gemma-cpu", engine="llama.cpp", args=("-c", "4096"), gpus=1, min_memory_gb=2,
                  node_selector={"gpu": "nvidia"}, ranks=1)


@pytest.mark.parametrize("model, profile, version", [
    (attrs.evolve(MODEL, source="/srv/models/gemma-v2.gguf"), PROFILE, "b6000"),
    (attrs.evolve(MODEL, sha256="cd" * 32), PROFILE, "b6000"),
    (attrs.evolve(MODEL, sha256=None), PROFILE, "b6000"),
    (MODEL, attrs.evolve(PROFILE, engine="vllm"), "b6000"),
    (MODEL, PROFILE, "b6001"),
    (MODEL, PROFILE, None),
    (MODEL, attrs.evolve(PROFILE, args=("-c", "8192")), "b6000"),
    (MODEL, attrs.evolve(PROFILE, args=()), "b6000"),
    (MODEL, attrs.evolve(PROFILE, gpus=2), "b6000"),
    (MODEL, attrs.evolve(PROFILE, ranks=2), "b6000"),
], ids=["source", "sha256", "no sha256", "engine", "engine version", "no engine version", "args", "no args",
        "gpus", "ranks"])
def test_what_changes_how_the_engine_runs_changes_the_fingerprint(model, profile, version):
    assert fingerprint(model, profile, version) != fingerprint(MODEL, PROFILE, "b6000")


@pytest.mark.parametrize("model, profile", [
    (attrs.evolve(MODEL, replicas=5), PROFILE),
    (MODEL, attrs.evolve(PROFILE, min_memory_gb=64)),
    (MODEL, attrs.evolve(PROFILE, min_memory_gb=None)),
    (MODEL, attrs.evolve(PROFILE, node_selector={"gpu": "amd"})),
    (MODEL, attrs.evolve(PROFILE, node_selector={})),
], ids=["replicas", "min_memory_gb", "no min_memory_gb", "node_selector", "no node_selector"])
def test_what_only_decides_where_a_replica_runs_leaves_the_fingerprint_alone(model, profile):
    assert fingerprint(model, profile, "b6000") == fingerprint(MODEL, PROFILE, "b6000")


def test_the_fingerprint_is_the_same_after_a_restart():
    """A replica started before the control plane restarted must not turn stale by the restart."""
    code = (
        "from llmgw.config.catalog import Model, Profile\n"
        "from llmgw.control.catalog import fingerprint\n"
        f"print(fingerprint(Model(name='gemma', profile='gemma-cpu', source='/srv/models/gemma.gguf',"
        f" replicas=1, sha256={SHA!r}), Profile(name='gemma-cpu', engine='llama.cpp', args=('-c', '4096'),"
        " gpus=1, min_memory_gb=2, node_selector={'gpu': 'nvidia'}, ranks=1), 'b6000'))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == fingerprint(MODEL, PROFILE, "b6000")


def test_entries_give_each_model_its_profile_and_its_engines_version(server_yaml):
    config = load_server_config(server_yaml)
    found = entries(config)
    assert sorted(found) == ["echo", "gemma"]
    gemma = found["gemma"]
    assert (gemma.model.replicas, gemma.profile.name, gemma.engine_version) == (1, "gemma-cpu", "b11194")
    assert gemma.fingerprint == fingerprint(gemma.model, gemma.profile, "b11194")
    # server.yaml names no sim version: none is part of its fingerprint.
    assert found["echo"].engine_version is None
    assert found["echo"].fingerprint == fingerprint(found["echo"].model, found["echo"].profile, None)


def test_a_new_engine_version_in_server_yaml_changes_only_that_engines_models(server_yaml):
    before = entries(load_server_config(server_yaml))
    server_yaml.write_text(SERVER_YAML + 'engines:\n  llama.cpp: {version: "b6100", sha256: {llama-b6100-bin-ubuntu-x64.tar.gz: "' + "ab" * 32 + '"}}\n')
    after = entries(load_server_config(server_yaml))
    assert after["gemma"].fingerprint != before["gemma"].fingerprint
    assert after["echo"].fingerprint == before["echo"].fingerprint


# -- profiles an engine would refuse --


@pytest.mark.parametrize("args, refused", [
    ('["--port", "9000"]', "--port"),
    ('["--port=9000"]', "--port"),
    ('["-c", "4096", "--host", "0.0.0.0"]', "--host"),
    ('["-m", "/tmp/other.gguf"]', "-m"),
])
def test_a_llama_cpp_profile_setting_what_llmgw_sets_is_refused_naming_file_and_profile(server_yaml, args, refused):
    server_yaml.write_text(SERVER_YAML.replace('args: ["-c", "4096"]', f"args: {args}"))
    config = load_server_config(server_yaml)
    with pytest.raises(ConfigError) as caught:
        check_profiles(config)
    assert str(caught.value) == (
        f"{server_yaml}: profiles.gemma-cpu: llama.cpp profiles may not set {refused}: llmgw sets it for each shard"
    )
    with pytest.raises(ConfigError):
        Catalog(config)


def test_every_refused_profile_is_named_at_once(server_yaml):
    server_yaml.write_text(
        SERVER_YAML.replace('args: ["-c", "4096"]', 'args: ["--port", "9000"]')
        .replace('args: ["--ttft-ms", "0"]', 'args: ["--model", "x"]')
    )
    with pytest.raises(ConfigError) as caught:
        check_profiles(load_server_config(server_yaml))
    assert str(caught.value) == (
        f"{server_yaml}: profiles.gemma-cpu: llama.cpp profiles may not set --port: llmgw sets it for each shard; "
        f"{server_yaml}: profiles.sim-fast: sim profiles may not set --model: llmgw sets it for each shard"
    )


def test_a_profile_no_model_uses_is_still_checked(server_yaml):
    spare = 'profiles:\n  spare: {engine: sim, args: ["--port", "1"]}\n'
    server_yaml.write_text(SERVER_YAML.replace("profiles:\n", spare))
    with pytest.raises(ConfigError, match="profiles.spare: sim profiles may not set --port"):
        Catalog(load_server_config(server_yaml))


def test_an_unused_llama_cpp_profile_is_accepted(server_yaml):
    server_yaml.write_text(SERVER_YAML.replace(
        "profiles:\n", 'profiles:\n  llama-gpu: {engine: llama.cpp, args: ["-ngl", "99"], gpus: 1}\n'))
    catalog = Catalog(load_server_config(server_yaml))
    assert sorted(catalog.entries) == ["echo", "gemma"]


def test_the_shipped_example_makes_a_catalog(tmp_path):
    text = (ROOT / "contrib" / "server.yaml.example").read_text()
    for name in ("ca.crt", "server.crt", "server.key"):
        assert f"/etc/llmgw/{name}" in text
        (tmp_path / name).write_text("")
        text = text.replace(f"/etc/llmgw/{name}", str(tmp_path / name))
    (tmp_path / "server.yaml").write_text(text)
    catalog = Catalog(load_server_config(tmp_path / "server.yaml"))
    assert set(catalog.entries) == {"gemma-3-270m", "llama-3.3-70b", "echo"}


# -- reloading --


def test_a_reload_says_which_engine_builds_the_nodes_now_install(server_yaml):
    catalog = Catalog(load_server_config(server_yaml))
    server_yaml.write_text(SERVER_YAML + 'engines:\n  llama.cpp: {version: "b6100", '
                           f'sha256: {{llama-b6100-bin-ubuntu-x64.zip: "{SHA}"}}}}\n')
    assert catalog.reload() == ["engines changed: the nodes now install llama.cpp b6100", "model gemma changed"]
    # No profile uses llama.cpp any more: the nodes are to install nothing.
    server_yaml.write_text(SERVER_YAML.replace('engine: llama.cpp, args: ["-c", "4096"], ', "engine: sim, "))
    assert catalog.reload()[0] == "engines changed: the nodes now install no engine builds"


def test_a_reload_reports_what_it_changed(server_yaml):
    catalog = Catalog(load_server_config(server_yaml))
    old_gemma = catalog.entries["gemma"]
    server_yaml.write_text(HEAD + """\
profiles:
  gemma-cpu: {engine: llama.cpp, args: ["-c", "8192"], min_memory_gb: 2}
  sim-fast: {engine: sim, args: ["--ttft-ms", "0"]}
models:
  gemma: {source: /srv/models/gemma.gguf, profile: gemma-cpu}
  echo2: {profile: sim-fast}
""")
    assert catalog.reload() == ["model echo removed", "model echo2 added", "model gemma changed"]
    assert sorted(catalog.entries) == ["echo2", "gemma"]
    assert catalog.entries["gemma"].fingerprint != old_gemma.fingerprint
    assert catalog.entries["gemma"].profile.args == ("-c", "8192")
    # Read again unchanged: nothing to report.
    assert catalog.reload() == []


@pytest.mark.parametrize("old, new", [
    ("replicas: 2", "replicas: 3"),
    ("sim-fast: {engine: sim,", "sim-fast: {engine: sim, min_memory_gb: 4,"),
])
def test_a_reload_reports_a_change_that_only_moves_replicas(server_yaml, old, new):
    catalog = Catalog(load_server_config(server_yaml))
    before = catalog.entries["echo"].fingerprint
    server_yaml.write_text(SERVER_YAML.replace(old, new))
    assert catalog.reload() == ["model echo changed"]
    # Running replicas are not wrong for it: they do not turn stale.
    assert catalog.entries["echo"].fingerprint == before


def test_a_reload_says_listen_and_tls_wait_for_a_restart(server_yaml):
    catalog = Catalog(load_server_config(server_yaml))
    server_yaml.write_text(SERVER_YAML.replace('"ssl:7443"', '"ssl:7444"'))
    assert catalog.reload() == ["listen.link changed: it takes effect when the server restarts"]
    (server_yaml.parent / "new.crt").write_text("")
    server_yaml.write_text(SERVER_YAML.replace('"ssl:7443"', '"ssl:7444"').replace("cert: server.crt", "cert: new.crt"))
    assert catalog.reload() == ["tls.cert changed: it takes effect when the server restarts"]


@pytest.mark.parametrize("broken, says", [
    (SERVER_YAML + "  oops: [\n", "YAML syntax"),
    (SERVER_YAML.replace("profile: sim-fast", "profile: sim-fats"), "no profile named 'sim-fats'"),
    (SERVER_YAML.replace('args: ["-c", "4096"]', 'args: ["--port", "9000"]'), "profiles.gemma-cpu"),
    ("", "the file is empty"),
], ids=["bad yaml", "unknown profile", "refused profile", "empty"])
def test_a_broken_file_is_refused_and_the_old_catalog_stays(server_yaml, broken, says):
    catalog = Catalog(load_server_config(server_yaml))
    before = dict(catalog.entries)
    config = catalog.config
    server_yaml.write_text(broken)
    with pytest.raises(ConfigError, match=says):
        catalog.reload()
    assert catalog.entries == before
    assert catalog.config is config
    # Fixed, the next reload is measured against the catalog that stayed.
    server_yaml.write_text(SERVER_YAML.replace("replicas: 2", "replicas: 1"))
    assert catalog.reload() == ["model echo changed"]
