"""A process whose port is taken ends at once with the address and the key, and does not run without it."""

from __future__ import annotations

import socket

import pytest

from llmgw.config.router import load_router_config
from llmgw.process import router as router_process
from tests.support.wait import wait_for


@pytest.fixture
def held_port():
    """A port another program listens on, for as long as the test runs."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.parametrize("key", ["listen.link", "listen.api", "listen.admin"])
def test_a_server_whose_port_is_taken_exits_non_zero_with_the_address_and_the_key(cluster, held_port, key):
    ports = {"listen.link": "link_port", "listen.api": "api_port", "listen.admin": "admin_port"}
    setattr(cluster, ports[key], held_port)
    cluster.write_server_config()
    server = cluster.start_server(wait=False)
    wait_for(lambda: not server.running(), 30, "the server to exit", detail=server.output)
    assert server.proc.returncode != 0
    line = f"cannot listen on 127.0.0.1:{held_port} ({key}): address already in use"
    assert line in server.output()
    assert "Traceback" not in server.output()


def test_a_router_whose_port_is_taken_ends_twistd_with_the_sentence(tmp_path, held_port):
    (tmp_path / "router.yaml").write_text(
        f'listen: {{api: "tcp:{held_port}:interface=127.0.0.1", admin: null}}\n'
        "router: {endpoints: [{model: echo, url: 'http://127.0.0.1:9/'}]}\n"
    )
    from twisted.internet import reactor

    top = router_process.build(reactor, load_router_config(tmp_path / "router.yaml"))
    with pytest.raises(SystemExit) as raised:
        top.privilegedStartService()
    assert str(raised.value).startswith(
        f"llmgw-router: cannot listen on 127.0.0.1:{held_port} (listen.api): address already in use"
    )


def test_make_run_with_the_hub_port_taken_says_so_and_shows_no_fleet(tmp_path, held_port):
    import subprocess
    import sys

    from tests.support.cluster import environment

    out = subprocess.run(
        [sys.executable, "-m", "llmgw.devrun"], capture_output=True, text=True, timeout=60,
        env=environment(LLMGW_RUN_DIR=str(tmp_path / "run"), LLMGW_LINK_PORT=str(held_port)),
    )
    assert out.returncode == 1
    assert f"cannot listen on 127.0.0.1:{held_port} (listen.link): address already in use" in out.stderr
    assert "llmgw is running" not in out.stdout
