"""router.yaml for `twistd llmgw-router`: what it takes, and what it refuses by file, line and key."""

from __future__ import annotations

import pytest

from llmgw.config.router import load_router_config
from llmgw.errors import ConfigError


def load(confdir, text):
    (confdir / "router.yaml").write_text(text)
    return load_router_config("router.yaml")


def test_static_endpoints_need_no_hub(confdir):
    config = load(confdir, 'router:\n  endpoints: [{model: echo, url: "http://10.0.0.5:8000"}]\n')
    assert config.hub is None and config.tls is None
    assert [(e.model, e.url) for e in config.router.endpoints] == [("echo", "http://10.0.0.5:8000")]
    assert config.listen.api == "tcp:8080:interface=127.0.0.1"


def test_following_the_hub_needs_tls(confdir):
    config = load(confdir, 'hub: "wss://cp:7443/"\ntls: {ca: ca.crt, cert: server.crt, key: server.key}\n')
    assert config.tls.ca == str(confdir / "ca.crt")


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "router.yaml:1: (document): the file is empty"),
        ('hub: "wss://cp:7443/"\n', "router.yaml:1: hub: joining the hub needs tls:"),
        ("listen: {api: \"tcp:8080\"}\n", "router.yaml:1: (document): the router knows no engines"),
        ('router:\n  endpoints: [{model: echo, url: "https://x:1"}]\n',
         "router.yaml:2: router.endpoints[0].url: 'https://x:1': an engine URL is http://HOST:PORT"),
        ('router:\n  endpoints: [{model: echo, url: "http://x:1/v1"}]\n',
         "router.yaml:2: router.endpoints[0].url: 'http://x:1/v1': an engine URL is http://HOST:PORT"),
        ('router:\n  endpoints: [{model: "bad name", url: "http://x:1"}]\n', "router.yaml:2: router.endpoints[0].model"),
        ('hub: "wss://cp:7443/"\ntls: {ca: nope.crt, cert: server.crt, key: server.key}\n', "router.yaml:2: tls.ca"),
        ('routr: {}\n', "router.yaml:1: routr: unknown key; did you mean 'router'?"),
    ],
)
def test_router_yaml_errors(confdir, text, message):
    with pytest.raises(ConfigError) as refused:
        load(confdir, text)
    assert str(refused.value).startswith(message), str(refused.value)
