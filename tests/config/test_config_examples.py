"""The shipped examples load (that the reference documents every key is test_reference's).

An operator starts from contrib/*.example; one that does not load is the
first thing they would hit.  The TLS paths in the examples name files that do
not exist here, so the test points them at files in a temporary directory and
checks that each replacement was made (else it would test nothing).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from llmgw.config import load_agent_config, load_ctl_config, load_server_config

ROOT = Path(__file__).resolve().parents[2]


def with_tls_files(name: str, tmp_path: Path, replace: dict[str, str]) -> Path:
    """Copy contrib/*name* into *tmp_path* with each TLS path pointed at an empty file."""
    text = (ROOT / "contrib" / name).read_text()
    for old, new in replace.items():
        assert old in text, f"{name} no longer names {old}; update this test"
        (tmp_path / new).write_text("")
        text = text.replace(old, str(tmp_path / new))
    path = tmp_path / name.removesuffix(".example")
    path.write_text(text)
    return path


def test_server_example_loads(tmp_path: Path) -> None:
    path = with_tls_files(
        "server.yaml.example",
        tmp_path,
        {"/etc/llmgw/ca.crt": "ca.crt", "/etc/llmgw/server.crt": "s.crt", "/etc/llmgw/server.key": "s.key"},
    )
    config = load_server_config(path)
    assert config.tls.key == str(tmp_path / "s.key")
    assert config.listen.link == "ssl:7443"
    # Every part of the example is live, not commented out, so it is all checked.
    assert set(config.models) == {"gemma-3-270m", "llama-3.3-70b", "echo"}
    assert {p.engine for p in config.profiles.values()} == {"llama.cpp", "vllm", "sim"}
    assert config.router.scoring == "prefix-affinity"


def load_agent_example(tmp_path: Path):
    """contrib/agent.yaml.example, loaded with its TLS files pointed into *tmp_path*."""
    return load_agent_config(with_tls_files(
        "agent.yaml.example",
        tmp_path,
        {"/etc/llmgw/ca.crt": "ca.crt", "/etc/llmgw/node.crt": "n.crt", "/etc/llmgw/node.key": "n.key"},
    ))


def test_agent_example_loads(tmp_path: Path) -> None:
    config = load_agent_example(tmp_path)
    assert (config.hub_host, config.hub_port) == ("cp.example.org", 7443)
    assert config.fabrics == {"mlx5_0": "ib-a"}
    assert config.tls.cert == str(tmp_path / "n.crt")


def test_the_agent_examples_engines_key_loads_once_uncommented(tmp_path: Path) -> None:
    path = with_tls_files(
        "agent.yaml.example",
        tmp_path,
        {"/etc/llmgw/ca.crt": "ca.crt", "/etc/llmgw/node.crt": "n.crt", "/etc/llmgw/node.key": "n.key"},
    )
    commented = "# engines:\n#   llama.cpp: {path: /opt/llama.cpp/build/bin/llama-server}\n"
    text = path.read_text()
    assert commented in text
    path.write_text(text.replace(commented, commented.replace("# ", "").replace("#", "")))
    assert load_agent_config(path).engine_path("llama.cpp") == "/opt/llama.cpp/build/bin/llama-server"


def test_ctl_example_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The example names files under ~; give it a home that has them."""
    home = tmp_path / "home"
    (home / ".config" / "llmgw").mkdir(parents=True)
    for name in ("ca.crt", "operator.crt", "operator.key"):
        (home / ".config" / "llmgw" / name).write_text("")
    monkeypatch.setenv("HOME", str(home))
    config = load_ctl_config(ROOT / "contrib" / "ctl.yaml.example")
    assert config.hub == "wss://cp.example.org:7443/"
    assert config.tls.key == os.path.join(home, ".config/llmgw/operator.key")
