"""agent.yaml files that are right: what the agent gets from them."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.config import TLSFiles, load_agent_config
from llmgw.errors import ConfigError

TLS = "tls: {ca: ca.crt, cert: server.crt, key: server.key}\n"


def test_the_same_file_on_every_node_needs_only_hub_and_tls(confdir: Path) -> None:
    (confdir / "agent.yaml").write_text('hub: "wss://cp.example.org:7443/"\n' + TLS)
    config = load_agent_config("agent.yaml")
    assert config.hub == ("wss://cp.example.org:7443/",)
    assert (config.hub_host, config.hub_port) == ("cp.example.org", 7443)
    assert config.tls == TLSFiles(
        ca=str(confdir / "ca.crt"), cert=str(confdir / "server.crt"), key=str(confdir / "server.key")
    )
    # Discovery fills these in; absent here means "find out", not "none".
    assert config.node_id is None
    assert config.labels == {}
    assert config.fabrics == {}
    assert config.weights_dirs == ("/var/lib/llmgw-weights",)
    assert config.state_dir == "/var/lib/llmgw"
    assert config.heartbeat_interval_s == 5.0
    assert config.engine_port_range == range(20000, 30000)
    assert config.engines == {}
    assert config.engine_path("llama.cpp") is None


def test_overrides(confdir: Path) -> None:
    (confdir / "agent.yaml").write_text(
        """\
hub: "wss://[fd00::1]:7443/"
tls:
  ca: /%s/ca.crt
  cert: server.crt
  key: server.key
node_id: gpu-07
labels: {rack: r12, "gpu.vendor": nvidia}
fabrics: {mlx5_0: ib-a, mlx5_1: ib-b}
weights_dirs: [/data/weights/, /mnt/shared/llmgw-weights]
state_dir: /srv/llmgw
heartbeat_interval_s: 2
engine_ports: 40000-40999
"""
        % str(confdir).lstrip("/")
    )
    config = load_agent_config("agent.yaml")
    assert (config.hub_host, config.hub_port) == ("fd00::1", 7443)
    assert config.tls.ca == str(confdir / "ca.crt")
    assert config.node_id == "gpu-07"
    assert config.labels == {"rack": "r12", "gpu.vendor": "nvidia"}
    assert config.fabrics == {"mlx5_0": "ib-a", "mlx5_1": "ib-b"}
    assert config.weights_dirs == ("/data/weights", "/mnt/shared/llmgw-weights")
    assert config.state_dir == "/srv/llmgw"
    assert config.heartbeat_interval_s == 2.0
    assert config.engine_port_range == range(40000, 41000)


def test_an_engine_built_by_hand_is_named_by_its_path(confdir: Path) -> None:
    """The path need not exist when the file is read: the agent's probe says what is wrong."""
    (confdir / "agent.yaml").write_text(
        'hub: "wss://cp:7443/"\n' + TLS
        + "engines:\n  llama.cpp: {path: /opt/llama.cpp/build/bin/llama-server}\n"
        + "  sglang: {path: /opt/sglang/bin/python}\n"
    )
    config = load_agent_config("agent.yaml")
    assert config.engine_path("llama.cpp") == "/opt/llama.cpp/build/bin/llama-server"
    assert config.engine_path("sglang") == "/opt/sglang/bin/python"
    assert config.engine_path("vllm") is None


def test_weights_dirs_need_not_exist(confdir: Path) -> None:
    """An unmounted shared filesystem must not stop the agent; discovery skips it."""
    (confdir / "agent.yaml").write_text(
        'hub: "wss://cp:7443/"\n' + TLS + "weights_dirs: [/nonexistent/llmgw-weights]\n"
    )
    assert load_agent_config("agent.yaml").weights_dirs == ("/nonexistent/llmgw-weights",)


@pytest.mark.parametrize("written", ["weights_dirs: []", "weights_dirs:"])
def test_an_empty_weights_list_is_the_default_directory(confdir: Path, written: str) -> None:
    """The agent fetches into the first entry; an empty list must not fetch where it never scans."""
    (confdir / "agent.yaml").write_text('hub: "wss://cp:7443/"\n' + TLS + written + "\n")
    assert load_agent_config("agent.yaml").weights_dirs == ("/var/lib/llmgw-weights",)


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "agent.yaml:1: (document): the file is empty; it needs hub: and tls:"),
        ("hub: wss://cp:7443/\n", "agent.yaml:1: tls: required key is missing"),
    ],
)
def test_what_a_fresh_node_sees_first(confdir: Path, text: str, message: str) -> None:
    (confdir / "agent.yaml").write_text(text)
    with pytest.raises(ConfigError) as e:
        load_agent_config("agent.yaml")
    assert str(e.value).startswith(message)


@pytest.mark.parametrize("value, why", [
    ('" h100"', "whitespace around it"),
    ('"h100 "', "whitespace around it"),
    ('"h\\u202e100"', "unprintable character U+202E"),
    ('"h\\x1b[2J"', "control character U+001B"),
    ('"%s"' % ("x" * 300), "300 characters"),
])
def test_a_label_the_server_would_refuse_at_register_is_refused_at_load(confdir: Path, value: str,
                                                                       why: str) -> None:
    # The link holds a label's value to a name's rule (llmgw.wiretext); an agent that
    # loaded one the server refuses would have its every register refused, so it is
    # refused here, naming the key, before the agent starts.
    (confdir / "agent.yaml").write_text('hub: "wss://cp.example.org:7443/"\n' + TLS + f"labels: {{gpu: {value}}}\n")
    with pytest.raises(ConfigError) as e:
        load_agent_config("agent.yaml")
    assert "labels.gpu" in str(e.value) and why in str(e.value)


@pytest.mark.parametrize("value, why", [
    ('"/data/weights "', "whitespace around it"),
    ('"/data/w\\x1b]0;x\\x07"', "control character U+001B"),
])
def test_a_directory_the_link_would_refuse_to_report_is_refused_at_load(confdir: Path, value: str,
                                                                      why: str) -> None:
    # weights_dirs travel in every heartbeat as paths; one the link refuses would
    # have the node's heartbeats refused for as long as it runs.
    (confdir / "agent.yaml").write_text('hub: "wss://cp.example.org:7443/"\n' + TLS + f"weights_dirs: [{value}]\n")
    with pytest.raises(ConfigError) as e:
        load_agent_config("agent.yaml")
    assert "weights_dirs" in str(e.value) and why in str(e.value)
