"""How the server's listeners send: at once when nothing waits, and each turn's TLS records in one pass.

Twisted's TCP transport never sends from ``write``: it appends the bytes to
its buffer and registers the socket for writability (an ``epoll_ctl``), the
next poll reports it writable, ``doWrite`` sends, and the socket is
unregistered again (another ``epoll_ctl``).  For a hub answering thousands
of small messages a second on as many connections (every heartbeat is a
CALL and its RESULT) that is two system calls and a turn of the loop per
answer, about a tenth of the server's CPU at 5,000 nodes.  ``EagerWrites``
sends at once when the transport holds nothing unsent, as asyncio's
transports do; what the socket does not take is buffered by the transport
as before, in order, and a connection that failed is found by the
transport's own next send.

Twisted's TLS layer gathers each connection's writes of one turn into one
record, flushed by a ``callLater(0)`` per connection.  ``TurnFlush`` is the
clock it is given instead: every connection's flush of the turn runs from
one reactor call.
"""

from __future__ import annotations

from twisted.logger import Logger
from twisted.protocols import policies

log = Logger()


def _nothing_waits(transport) -> bool:
    """Whether *transport* (Twisted's TCP transport) has nothing unsent and would take a write now.

    False for anything else (a test's transport in memory), whose own
    ``write`` is then used as it is.
    """
    try:
        return (transport.connected and not transport.disconnecting and not transport._writeDisconnected
                # Aborted: Twisted's own write would buffer and then drop it with the socket.
                and not transport._aborting
                and not transport._tempDataLen and transport.offset == len(transport.dataBuffer)
                # A pull producer is asked for more only by the transport's doWrite.
                and (transport.producer is None or (transport.streamingProducer and not transport.producerPaused)))
    except AttributeError:
        return False


class EagerWrites(policies.ProtocolWrapper):
    """A listener's wrapper over each TCP connection: a write goes to the socket at once when nothing waits before it."""

    eager = 0  # writes sent whole at once (the tests read it)

    def write(self, data: bytes) -> None:
        transport = self.transport
        if type(data) is bytes and data and _nothing_waits(transport):
            sent = transport.writeSomeData(data)
            if type(sent) is int:
                if sent >= len(data):
                    self.eager += 1
                    return
                data = data[sent:]
            # Else the connection is lost: the transport's own send finds it and closes.
        transport.write(data)


class _Due:
    """One flush ``TurnFlush`` will run: what ``callLater`` returns (the TLS layer cancels it on close)."""

    __slots__ = ("call", "args", "kwargs", "cancelled", "called")

    def __init__(self, call, args, kwargs):
        self.call = call
        self.args = args
        self.kwargs = kwargs
        self.cancelled = False
        self.called = False

    def cancel(self) -> None:
        self.cancelled = True

    def active(self) -> bool:
        return not (self.cancelled or self.called)


class TurnFlush:
    """The clock ``TLSMemoryBIOFactory`` aggregates writes by: every ``callLater(0)`` of a turn run from one reactor call.

    Calls with a delay go to the reactor as they are.  A flush asked for
    while the batch runs goes to the next one, as a ``callLater(0)`` made
    during the reactor's own pass waits for its next.
    """

    def __init__(self, reactor):
        self._reactor = reactor
        self._due: list[_Due] = []
        self._call = None

    def seconds(self) -> float:
        return self._reactor.seconds()

    def getDelayedCalls(self):
        return self._reactor.getDelayedCalls()

    def callLater(self, delay: float, call, *args, **kwargs):
        if delay:
            return self._reactor.callLater(delay, call, *args, **kwargs)
        due = _Due(call, args, kwargs)
        self._due.append(due)
        if self._call is None:
            self._call = self._reactor.callLater(0, self._run)
        return due

    def _run(self) -> None:
        self._call = None
        batch, self._due = self._due, []
        done = 0
        try:
            for due in batch:
                done += 1
                if due.cancelled:
                    continue
                due.called = True
                try:
                    due.call(*due.args, **due.kwargs)
                except Exception:
                    log.failure("flushing a connection's TLS writes")
        finally:
            if done < len(batch):
                # Interrupted (a BaseException): the rest flush next turn rather than never,
                # since each connection's TLS layer waits on its flush before asking again.
                self._due[:0] = batch[done:]
                if self._call is None:
                    self._call = self._reactor.callLater(0, self._run)
