"""server.yaml's ha: absent is no etcd, present is checked key by key, and the lease's parts must fit in it."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from llmgw.config import load_server_config
from llmgw.errors import ConfigError

SERVER = 'listen: {link: "ssl:7443"}\ntls: {ca: ca.crt, cert: server.crt, key: server.key}\n'
HA = "ha: {etcd: [http://10.0.0.5:2379, 'https://etcd2:2379/'], advertise: 'wss://gw1.example:7443/'"


def load(confdir: Path, text: str):
    (confdir / "server.yaml").write_text(SERVER + text + "\n")
    return load_server_config("server.yaml")


def test_without_ha_no_etcd_is_named(confdir: Path) -> None:
    assert load(confdir, "").ha is None


def test_ha_takes_its_defaults_and_the_host_name(confdir: Path) -> None:
    ha = load(confdir, HA + "}").ha
    assert ha.etcd == ("http://10.0.0.5:2379", "https://etcd2:2379")
    assert (ha.lease_s, ha.fence_margin_s, ha.request_timeout_s, ha.tls, ha.api_advertise) == (5, 1.0, 2.0, None, None)
    assert ha.server_name() == socket.gethostname()
    secure = "ha: {etcd: ['https://etcd1:2379'], advertise: 'wss://gw1:7443/', name: gw1, " \
             "tls: {ca: ca.crt, cert: server.crt, key: server.key}}"
    ha = load(confdir, secure).ha
    assert ha.tls.ca == str(confdir / "ca.crt") and ha.server_name() == "gw1"


@pytest.mark.parametrize("text, expected", [
    ("ha: {advertise: 'wss://gw1:7443/'}", "server.yaml:3: ha.etcd: required key is missing"),
    ("ha: {etcd: [http://e:2379]}", "server.yaml:3: ha.advertise: required key is missing"),
    ("ha: {etcd: ['etcd1:2379'], advertise: 'wss://gw1:7443/'}", "server.yaml:3: ha.etcd[0]: 'etcd1:2379': an etcd "
     "client URL starts with http:// or https://"),
    ("ha: {etcd: ['http://etcd1'], advertise: 'wss://gw1:7443/'}", "give the host and the client port"),
    ("ha: {etcd: ['http://e:2379/v3'], advertise: 'wss://gw1:7443/'}", "give only scheme, host and port"),
    ("ha: {etcd: ['http://e:2379'], advertise: 'https://gw1:7443/'}", "server.yaml:3: ha.advertise: "
     "'https://gw1:7443/': the hub URL must start with wss://"),
    (HA + ", lease_s: 1}", "server.yaml:3: ha.lease_s: must be an integer >= 2, got 1"),
    (HA + ", name: 'a b'}", "server.yaml:3: ha.name:"),
    (HA + ", api_advertise: 'gw1:8080'}", "server.yaml:3: ha.api_advertise: 'gw1:8080': write the API's URL"),
    (HA + ", max_response_bytes: 10}", "ha.max_response_bytes: must be an integer >= 65536, got 10"),
    (HA + ", lease_s: 3, fence_margin_s: 3}", "server.yaml:3: ha.fence_margin_s: must be less than ha.lease_s (3)"),
    (HA + ", lease_s: 3, request_timeout_s: 2}", "server.yaml:3: ha.request_timeout_s: must be less than ha.lease_s "
     "less ha.fence_margin_s (2)"),
    (HA + ", tls: {ca: ca.crt, cert: server.crt, key: server.key}}",
     "server.yaml:3: ha.etcd: http://10.0.0.5:2379 is plain http but ha.tls is given; write https://"),
    (HA + ", leese_s: 5}", "server.yaml:3: ha.leese_s: unknown key; did you mean 'lease_s'?"),
])
def test_a_bad_value_is_refused_naming_the_key(confdir: Path, text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load(confdir, text)
    assert expected in str(refused.value)
