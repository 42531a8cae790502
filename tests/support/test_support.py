"""The support package's own promises: waiters say what they awaited, and a held download stays held."""

from __future__ import annotations

import hashlib
import socket
import subprocess
import sys
import threading
import urllib.request

import pytest
import pytest_twisted

from tests.support.modelfile import ModelFile
from tests.support import net
from tests.support.net import free_port, post
from tests.support.procs import alive
from tests.support.wait import NeverHappened, sleep, until, until_awaited, wait_for


def test_wait_for_returns_the_first_true_value():
    looks = iter([None, 0, [], "there"])
    assert wait_for(lambda: next(looks), 5, "the fourth look", interval=0) == "there"


def test_wait_for_names_what_it_awaited_and_the_last_value_at_the_deadline():
    with pytest.raises(NeverHappened) as raised:
        wait_for(lambda: [], 0.05, "the queue to fill", interval=0.01, detail=lambda: "the server said nothing")
    assert str(raised.value) == ("timed out after 0.05 s waiting for the queue to fill (last: [])\n"
                                 "the server said nothing")


@pytest_twisted.ensureDeferred
async def test_until_waits_with_the_reactor_running_and_fails_the_same_way():
    from twisted.internet import reactor

    fired = []
    reactor.callLater(0.05, fired.append, "late")
    assert await until(lambda: fired, "the call") == ["late"]
    with pytest.raises(NeverHappened, match=r"waiting for nothing \(last: None\)"):
        await until(lambda: None, "nothing", timeout=0.05)


@pytest_twisted.ensureDeferred
async def test_until_pauses_as_told_between_looks():
    from twisted.internet import task

    clock = task.Clock()
    fired = []
    clock.callLater(3, fired.append, "at three clock seconds")

    async def a_clock_second(interval):
        await sleep(interval)
        clock.advance(1)

    assert await until(lambda: fired, "the clock's call", pause=a_clock_second) == ["at three clock seconds"]
    assert clock.seconds() == 3


@pytest_twisted.ensureDeferred
async def test_until_awaited_looks_with_a_check_that_waits_and_fails_the_same_way():
    looks = iter([None, "", "there"])

    async def look():
        await sleep(0)
        return next(looks)

    assert await until_awaited(look, "the third look", interval=0) == "there"

    async def never():
        await sleep(0)
        return []

    with pytest.raises(NeverHappened, match=r"waiting for the page \(last: \[\]\)\nits text"):
        await until_awaited(never, "the page", timeout=0.05, detail=lambda: "its text")


def test_a_held_download_sends_up_to_its_stop_and_the_rest_only_once_released():
    payload = bytes(range(256)) * 1000
    served = ModelFile("m.gguf", payload, stops=(100_000,), chunk=30_000).start()
    got = bytearray()
    try:
        def read():
            with urllib.request.urlopen(served.url, timeout=10) as r:
                while piece := r.read(10_000):
                    got.extend(piece)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        wait_for(lambda: served.reached == 1 and len(got) == 100_000, 10, "the first 100 kB, then the stop",
                 detail=lambda: f"{len(got)} bytes read")
        served.release()
        reader.join(10)
        assert not reader.is_alive()
        assert hashlib.sha256(got).hexdigest() == served.sha256
        assert served.requests == ["/m.gguf"]
    finally:
        served.stop()


def test_a_process_is_alive_until_it_exits_even_before_it_is_reaped():
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        assert alive(child.pid)
        child.stdin.close()  # it exits on end of input; until wait() reaps it, it is a zombie
        wait_for(lambda: not alive(child.pid), 10, "the child to exit")
    finally:
        child.wait(timeout=10)
    assert not alive(child.pid)


def test_post_sends_json_with_its_length_and_lets_a_test_replace_a_header():
    assert post("/v1/x", {"a": 1}) == (b"POST /v1/x HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\n"
                                       b"Content-Length: 8\r\n\r\n{\"a\": 1}")
    head = post("/v1/x", b"", headers={"Content-Length": "12", "Expect": "100-continue"}, version="1.0")
    assert head == (b"POST /v1/x HTTP/1.0\r\nHost: router\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 12\r\nExpect: 100-continue\r\n\r\n")


def test_a_free_port_is_below_the_ephemeral_range_and_never_handed_out_twice():
    # bind(0) hands out ephemeral ports, which any outgoing connection may take
    # before the listener starts (CI once lost a server's link port that way).
    low = net._first_ephemeral_port()
    ports = [free_port() for _ in range(50)]
    assert all(1024 <= port < low for port in ports), ports
    assert len(set(ports)) == len(ports)


def test_a_port_someone_listens_on_is_passed_over(monkeypatch):
    held = socket.create_server(("127.0.0.1", 0))
    with held:
        taken = held.getsockname()[1]
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            spare = probe.getsockname()[1]
        draws = iter([taken, spare])
        monkeypatch.setattr(net, "_pick", type("Draws", (), {"choice": staticmethod(lambda _: next(draws))})())
        assert free_port() == spare
