"""How the server's listeners send (``llmgw.process.sending``): at once when nothing waits, in order when the socket is full.

Real TCP connections on 127.0.0.1 through a ``ConnectionBudget`` (whose
wrapper is ``EagerWrites``); ``TurnFlush`` on a test clock.
"""

from __future__ import annotations

import hashlib
import socket

import pytest
import pytest_twisted
from twisted.internet import defer, endpoints, error, protocol, reactor, task
from zope.interface import implementer
from twisted.internet.interfaces import IPullProducer

from llmgw.process.common import ConnectionBudget
from llmgw.process.sending import EagerWrites, TurnFlush, _nothing_waits
from tests.support.wait import until


class Held(protocol.Protocol):
    """The server's side: kept so the test can write through it."""

    def connectionMade(self):
        self.factory.held.callback(self)


class Reader(protocol.Protocol):
    """The client's side: everything it reads, and whether the connection closed."""

    def connectionMade(self):
        self.got = bytearray()
        self.lost = defer.Deferred()

    def dataReceived(self, data):
        self.got += data

    def connectionLost(self, reason):
        self.lost.callback(None)


async def _pair():
    """(the server's Held, its EagerWrites wrapper, the client's Reader, the port)."""
    inner = protocol.Factory.forProtocol(Held)
    inner.held = defer.Deferred()
    budget = ConnectionBudget(10, "listen.test")
    budget.wrap(inner)
    port = await endpoints.TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(budget)
    client = await endpoints.TCP4ClientEndpoint(reactor, "127.0.0.1", port.getHost().port).connect(
        protocol.Factory.forProtocol(Reader))
    held = await inner.held.addTimeout(5, reactor)
    assert isinstance(held.transport, EagerWrites)
    return held, held.transport, client, port


async def _close(client, port):
    client.transport.loseConnection()
    await client.lost.addTimeout(5, reactor)
    await port.stopListening()


@pytest_twisted.ensureDeferred
async def test_a_write_with_nothing_waiting_goes_to_the_socket_at_once():
    held, wrapper, client, port = await _pair()
    try:
        tcp = wrapper.transport
        held.transport.write(b"answer")
        # Sent within the write: nothing buffered, the socket not waiting on the reactor.
        assert wrapper.eager == 1
        assert tcp._tempDataLen == 0 and tcp.dataBuffer == b""
        assert tcp not in reactor.getWriters()
        await until(lambda: bytes(client.got) == b"answer", "the client to read it")
    finally:
        await _close(client, port)


@pytest_twisted.ensureDeferred
async def test_what_a_full_socket_does_not_take_is_buffered_and_arrives_whole_and_in_order():
    held, wrapper, client, port = await _pair()
    try:
        client.transport.pauseProducing()  # the client stops reading: the kernel's buffers fill
        tcp = wrapper.transport
        chunks = []
        # A chunk a turn, so the transport's own sends run between: the socket is
        # full when, after a turn, the transport still holds what it could not send.
        while len(chunks) < 256 and _nothing_waits(tcp):
            chunks.append(bytes([len(chunks) % 251]) * 256_000)
            held.transport.write(chunks[-1])
            await task.deferLater(reactor, 0, lambda: None)
        assert not _nothing_waits(tcp), "the socket never filled"
        eager = wrapper.eager
        held.transport.write(b"end")  # after what waits, never before it
        assert wrapper.eager == eager
        client.transport.resumeProducing()
        want = b"".join(chunks) + b"end"
        await until(lambda: len(client.got) >= len(want), "the client to read everything", timeout=60)
        assert hashlib.sha256(client.got).digest() == hashlib.sha256(want).digest()
        assert _nothing_waits(tcp)
    finally:
        await _close(client, port)


@pytest_twisted.ensureDeferred
async def test_nothing_is_sent_after_the_connection_is_aborted():
    held, wrapper, client, port = await _pair()
    try:
        held.transport.abortConnection()
        held.transport.write(b"after the abort")
        # Twisted's own write buffers it, and the abort drops it with the socket.
        assert wrapper.eager == 0
        assert wrapper.transport._tempDataLen == len(b"after the abort")
        await client.lost.addTimeout(5, reactor)
    finally:
        await port.stopListening()


@implementer(IPullProducer)
class Pull:
    """A pull producer: writes one chunk each time it is asked, *n* in all, then unregisters."""

    def __init__(self, consumer, n):
        self.consumer = consumer
        self.left = n
        self.done = defer.Deferred()

    def resumeProducing(self):
        self.consumer.write(b"p" * 1000)
        self.left -= 1
        if not self.left:
            self.consumer.unregisterProducer()
            self.done.callback(None)

    def stopProducing(self):
        pass


@pytest_twisted.ensureDeferred
async def test_a_pull_producer_is_still_asked_for_more_after_each_write():
    # A pull producer is asked again only from the transport's doWrite; a
    # write sent at once would never get there and the producer would stall.
    held, wrapper, client, port = await _pair()
    try:
        producer = Pull(held.transport, 20)
        held.transport.registerProducer(producer, False)
        await producer.done.addTimeout(10, reactor)
        await until(lambda: len(client.got) == 20_000, "the client to read all twenty chunks")
    finally:
        await _close(client, port)


@pytest_twisted.ensureDeferred
async def test_a_send_that_fails_leaves_the_write_to_the_transport_which_closes_the_connection():
    held, wrapper, client, port = await _pair()
    lost = defer.Deferred()
    held.connectionLost = lambda reason: lost.callback(reason.value)
    try:
        wrapper.transport.socket.shutdown(socket.SHUT_WR)  # every send on it now fails (EPIPE)
        held.transport.write(b"never sent")
        assert wrapper.eager == 0
        reason = await lost.addTimeout(5, reactor)
        assert isinstance(reason, error.ConnectionLost)
    finally:
        await _close(client, port)


def test_a_transport_that_is_not_twisteds_tcp_is_written_as_it_is():
    from twisted.internet.testing import StringTransport

    wrapper = EagerWrites(ConnectionBudget(1, "listen.test"), protocol.Protocol())
    transport = StringTransport()
    wrapper.makeConnection(transport)
    wrapper.write(b"kept")
    assert transport.value() == b"kept" and wrapper.eager == 0


def test_every_flush_of_a_turn_runs_from_one_reactor_call_and_in_order():
    clock = task.Clock()
    turns = TurnFlush(clock)
    ran = []
    for name in "abc":
        turns.callLater(0, ran.append, name)
    assert len(clock.getDelayedCalls()) == 1
    clock.advance(0)
    assert ran == ["a", "b", "c"]
    assert clock.getDelayedCalls() == []


def test_a_cancelled_flush_does_not_run_and_one_asked_for_while_flushing_waits_for_the_next_turn():
    clock = task.Clock()
    turns = TurnFlush(clock)
    ran = []
    cancelled = turns.callLater(0, ran.append, "cancelled")
    turns.callLater(0, lambda: turns.callLater(0, ran.append, "next turn"))
    cancelled.cancel()
    assert not cancelled.active()
    (batch,) = clock.getDelayedCalls()
    clock.calls.remove(batch)
    batch.func()  # the reactor's call for this turn, run as the reactor would
    assert ran == []  # the cancelled one did not run; the one asked for meanwhile waits
    (following,) = clock.getDelayedCalls()  # a reactor call of its own for the next turn
    assert following is not batch
    clock.advance(0)
    assert ran == ["next turn"]


def test_a_batch_cut_short_flushes_the_rest_next_turn():
    clock = task.Clock()
    turns = TurnFlush(clock)
    ran = []

    def interrupted():
        raise KeyboardInterrupt

    turns.callLater(0, ran.append, "first")
    turns.callLater(0, interrupted)
    turns.callLater(0, ran.append, "after")
    (batch,) = clock.getDelayedCalls()
    clock.calls.remove(batch)
    with pytest.raises(KeyboardInterrupt):
        batch.func()
    assert ran == ["first"]
    clock.advance(0)
    assert ran == ["first", "after"]


def test_a_flush_that_fails_is_logged_and_the_others_still_run():
    from twisted.logger import globalLogPublisher

    clock = task.Clock()
    turns = TurnFlush(clock)
    ran, logged = [], []
    globalLogPublisher.addObserver(logged.append)
    try:
        turns.callLater(0, lambda: 1 / 0)
        turns.callLater(0, ran.append, "after")
        clock.advance(0)
    finally:
        globalLogPublisher.removeObserver(logged.append)
    assert ran == ["after"]
    assert any("flushing a connection's TLS writes" in str(e.get("log_format")) for e in logged)


def test_a_call_with_a_delay_goes_to_the_reactor_as_it_is():
    clock = task.Clock()
    turns = TurnFlush(clock)
    ran = []
    call = turns.callLater(1.5, ran.append, "later")
    assert call in clock.getDelayedCalls()
    clock.advance(1.5)
    assert ran == ["later"]
    assert turns.seconds() == clock.seconds()

