"""How the server's listeners send (``llmgw.process.sending``): at once when nothing waits, in order when the socket is full.

Real TCP connections on 127.0.0.1 through a ``ConnectionBudget`` (whose
wrapper is ``EagerWrites``); ``TurnFlush`` on a test clock.
"""

from __future__ import annotations

import hashlib
import socket

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
        chunks = [bytes([i % 251]) * 1_000_000 for i in range(24)]
        for chunk in chunks:
            held.transport.write(chunk)
        tcp = wrapper.transport
        assert tcp._tempDataLen > 0  # the socket took some, the rest waits in the transport
        assert wrapper.eager < len(chunks)
        assert not _nothing_waits(tcp)
        held.transport.write(b"end")  # after what waits, never before it
        client.transport.resumeProducing()
        want = b"".join(chunks) + b"end"
        await until(lambda: len(client.got) >= len(want), "the client to read everything", timeout=60)
        assert hashlib.sha256(client.got).digest() == hashlib.sha256(want).digest()
        assert _nothing_waits(tcp)
    finally:
        await _close(client, port)


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
    reactor_calls = []

    def flushing():
        turns.callLater(0, ran.append, "next turn")
        reactor_calls.extend(clock.getDelayedCalls())  # a call of its own, not this batch's
        assert ran == []

    turns.callLater(0, flushing)
    cancelled.cancel()
    assert not cancelled.active()
    clock.advance(0)
    assert len(reactor_calls) == 1 and reactor_calls[0].called
    assert ran == ["next turn"]


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

