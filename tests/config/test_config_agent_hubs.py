"""agent.yaml's hub: one URL, or the list of a cluster's servers in the order the agent dials them."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.config import load_agent_config
from llmgw.config.agent import MOST_HUBS
from llmgw.errors import ConfigError

TLS = "tls: {ca: ca.crt, cert: server.crt, key: server.key}\n"


def load(confdir: Path, hub: str):
    (confdir / "agent.yaml").write_text(f"hub: {hub}\n" + TLS)
    return load_agent_config("agent.yaml")


def refusal(confdir: Path, hub: str) -> str:
    with pytest.raises(ConfigError) as refused:
        load(confdir, hub)
    return str(refused.value)


def test_one_url_or_a_list_both_read_as_the_hubs_in_order(confdir: Path) -> None:
    assert load(confdir, '"wss://a.example.org:7443/"').hub == ("wss://a.example.org:7443/",)
    config = load(confdir, '["wss://a.example.org:7443/", "wss://b.example.org:7443/"]')
    assert config.hub == ("wss://a.example.org:7443/", "wss://b.example.org:7443/")
    assert (config.hub_host, config.hub_port) == ("a.example.org", 7443)


def test_a_list_of_hubs_is_refused_naming_the_entry_and_what_to_do(confdir: Path) -> None:
    assert refusal(confdir, "[]") == (
        "agent.yaml:1: hub: the list of hubs is empty; give at least one, like 'wss://cp.example.org:7443/'")
    assert refusal(confdir, '["wss://a.example.org:7443/", "wss://b.example.org/"]').startswith(
        "agent.yaml:1: hub[1]: 'wss://b.example.org/': the hub URL has no port")
    assert refusal(confdir, '["wss://a.example.org:7443/", "wss://A.example.org:7443/"]') == (
        "agent.yaml:1: hub[1]: 'wss://A.example.org:7443/' names the same host and port as "
        "'wss://a.example.org:7443/'; list each server once")
    many = "[" + ", ".join(f'"wss://s{i}.example.org:7443/"' for i in range(MOST_HUBS + 1)) + "]"
    assert refusal(confdir, many) == (
        f"agent.yaml:1: hub: {MOST_HUBS + 1} hubs; at most {MOST_HUBS} (one per server of the cluster)")
    assert refusal(confdir, "{a: 1}") == (
        "agent.yaml:1: hub: expected a hub URL like wss://HOST:PORT/, or a list of them, got a mapping")
