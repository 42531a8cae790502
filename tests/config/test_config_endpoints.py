"""Listener strings are checked the way Twisted will read them, without listening."""

from __future__ import annotations

import pytest

from llmgw.config import ServerEndpoint, parse_server_endpoint
from llmgw.config.endpoints import check_link_listener


@pytest.mark.parametrize(
    "text, kind, port, interface, address",
    [
        ("tcp:8080", "tcp", 8080, None, None),
        ("tcp:8080:interface=127.0.0.1", "tcp", 8080, "127.0.0.1", None),
        (r"tcp:8080:interface=\:\:1", "tcp", 8080, "::1", None),
        ("tcp6:port=8080:interface=\\:\\:", "tcp6", 8080, "::", None),
        ("ssl:port=7443:interface=10.0.0.1", "ssl", 7443, "10.0.0.1", None),
        ("tcp:0", "tcp", 0, None, None),
        ("unix:/run/llmgw/api.sock:mode=660", "unix", None, None, "/run/llmgw/api.sock"),
    ],
)
def test_parts(text: str, kind: str, port, interface, address) -> None:
    endpoint = parse_server_endpoint(text)
    assert (endpoint.kind, endpoint.port, endpoint.interface, endpoint.address) == (
        kind,
        port,
        interface,
        address,
    )
    assert endpoint.text == text


def test_positional_parts_take_twisteds_order() -> None:
    assert parse_server_endpoint("tcp:8080:127.0.0.1:20") == ServerEndpoint(
        text="tcp:8080:127.0.0.1:20",
        kind="tcp",
        port=8080,
        interface="127.0.0.1",
        backlog=20,
        options={"port": "8080", "interface": "127.0.0.1", "backlog": "20"},
    )


@pytest.mark.parametrize(
    "text, why",
    [
        ("8080", "unknown listener kind '8080'; write tcp:PORT, tcp6:PORT, ssl:PORT or unix:PATH"),
        ("tcp:", "no port given; write it like 'tcp:8080'"),
        ("unix:", "no address given; write it like 'unix:/run/llmgw/api.sock'"),
        ("tcp:65536", "port must be a whole number from 0 to 65535, got '65536'"),
        ("tcp:-1", "port must be a whole number from 0 to 65535, got '-1'"),
        ("tcp:8080:backlog=0", "backlog must be a whole number of 1 or more, got '0'"),
        ("tcp:8080:iface=lo", "tcp: has no option 'iface'; its options are port, interface, backlog"),
        ("tcp:8080:port=9090", "port is given twice"),
        ("tcp:1:a:2:3", "too many positional parts for tcp: (it takes at most 3)"),
    ],
)
def test_refusals(text: str, why: str) -> None:
    with pytest.raises(ValueError) as e:
        parse_server_endpoint(text)
    assert str(e.value) == why


@pytest.mark.parametrize("text", ["ssl:7443", "ssl:port=7443:interface=0.0.0.0:backlog=100"])
def test_link_listener_accepts_plain_ssl(text: str) -> None:
    check_link_listener(text)


def test_link_listener_refuses_a_positional_private_key() -> None:
    """``ssl:7443:server.pem`` names a key without saying privateKey=."""
    with pytest.raises(ValueError, match=r"^remove privateKey=: .* come from tls:"):
        check_link_listener("ssl:7443:server.pem")
