"""The hub URL: one parser for the configuration that accepts it and the link that dials it."""

from __future__ import annotations

import re

import pytest

from llmgw.config import load_agent_config
from llmgw.huburl import HubAddress, parse_hub_url


@pytest.mark.parametrize("url, host, port", [
    ("wss://cp.example.org:7443/", "cp.example.org", 7443),
    ("wss://CP.Example.org:7443", "cp.example.org", 7443),
    ("wss://[fd00::1]:7443/", "fd00::1", 7443),
    ("wss://10.0.0.5:1/", "10.0.0.5", 1),
])
def test_a_hub_url_names_the_host_and_port_to_dial(url, host, port):
    assert parse_hub_url(url) == HubAddress(url, host, port)


@pytest.mark.parametrize("url, says", [
    ("ws://cp:7443/", "must start with wss:// (the link is always TLS)"),
    ("wss://cp/", "has no port"),
    ("wss://cp:0/", "port 0 cannot be dialled"),
    ("wss://alice@cp:7443/", "remove the user name"),
    ("wss://cp:7443/?x=1", "remove the '?...'"),
    ("wss://:7443/", "has no host"),
    ("wss://cp:99999/", "not a URL: its port is not a number from 1 to 65535"),
    ("wss://cp:seven/", "not a URL: its port is not a number from 1 to 65535"),
    ("wss://cp:-1/", "not a URL: its port is not a number from 1 to 65535"),
    ("wss://[fd00::1:7443/", "not a URL: a '[' opens an IPv6 address that no ']' closes"),
])
def test_a_url_that_cannot_be_dialled_says_what_to_change(url, says):
    with pytest.raises(ValueError, match=re.escape(says)) as refused:
        parse_hub_url(url)
    for python in ("cast to integer", "Port out of range", "Invalid IPv6"):
        assert python not in str(refused.value)


def test_the_agent_dials_what_its_configuration_accepted(tmp_path):
    for name in ("ca.crt", "node.crt", "node.key"):
        (tmp_path / name).write_text("x")
    (tmp_path / "agent.yaml").write_text(
        'hub: "wss://[fd00::1]:7443/"\ntls: {ca: ca.crt, cert: node.crt, key: node.key}\n'
    )
    config = load_agent_config(tmp_path / "agent.yaml")
    assert parse_hub_url(config.hub[0]) == HubAddress("wss://[fd00::1]:7443/", "fd00::1", 7443)
    assert (config.hub_host, config.hub_port) == ("fd00::1", 7443)
