"""Clients that stopped reading, on a clock: cut after ``write_stall_timeout_s``, sooner if a slot is wanted.

A client that stops reading makes the router's buffer for it fill, and its
connection pauses what writes to it (``server.RouterProtocol.writes_paused``):
the relay from the engine, or the router's own answers.  Two clocks start:

* ``router.clients.write_stall_timeout_s`` for any connection: nothing read
  for that long, it is closed (``client_timeouts_total{kind="write_stall"}``,
  ``RouterProtocol.write_stalled``).
* ``router.client_stall_s`` for a stream that holds an engine slot, which
  counts against its client's share (``fairqueue``) all the while: paused
  that long, and a request waiting for a slot of its model — then, or at
  any moment later while still paused — it is cut: the connection closed,
  the engine's request aborted, the slot freed for the waiter,
  ``client_stalls_cut_total`` counted and one line logged with the client's
  key and address.

A client that reads again starts both afresh.  Clock-driven, no sockets:
tests drive it with ``twisted.internet.task.Clock`` and stand-in connections.

Neither clock starts before the router's own buffer fills, and the kernel's
send buffer for the connection lies before it: Linux grows it to
``net.ipv4.tcp_wmem``'s largest (4 MiB by default) for a client that does
not read, some 12 s of a stream at 1000 tokens/s.  ``limit_unsent`` caps
what the kernel holds unsent (``TCP_NOTSENT_LOWAT``), so an unread stream
pauses once the client's own receive buffer is full; data in flight is not
limited, so a fast client on a long path is not slowed.
"""

from __future__ import annotations

import socket
from typing import Callable

from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

log = Logger()

# TCP_NOTSENT_LOWAT (Linux 3.12, macOS); absent: the kernel's own send buffer applies.
_NOTSENT_LOWAT = getattr(socket, "TCP_NOTSENT_LOWAT", None)


def limit_unsent(transport, nbytes: int) -> bool:
    """Let the kernel hold at most about *nbytes* of *transport*'s writes unsent; False where it cannot be set.

    *transport* is a TCP transport or one wrapping it (TLS); another kind
    (a UNIX socket, a test's stand-in) is left as it is.
    """
    while transport is not None:
        sock = getattr(transport, "socket", None)
        if isinstance(sock, socket.socket):
            if _NOTSENT_LOWAT is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
                return False
            try:
                sock.setsockopt(socket.IPPROTO_TCP, _NOTSENT_LOWAT, nbytes)
            except OSError:
                return False
            return True
        transport = getattr(transport, "transport", None)
    return False


class _Stall:
    __slots__ = ("since", "write_timer", "slot_timer", "model")

    def __init__(self, since: float):
        self.since = since
        self.write_timer: IDelayedCall | None = None
        self.slot_timer: IDelayedCall | None = None
        # The model whose slot the stalled stream holds; None: it holds none.
        self.model: str | None = None


def held_model(conn) -> str | None:
    """The model whose engine slot *conn*'s exchange holds now, or None."""
    exchange = conn.exchange
    if exchange is None or exchange.lease is None or conn.lost:
        return None
    return exchange.info.model


class StallWatch:
    """The connections whose writes are paused, with their clocks; the overdue streams, by model."""

    def __init__(self, clock: IReactorTime, write_stall_s: Callable[[], float], client_stall_s: Callable[[], float | None],
                 waiting: Callable[[str], int], counted: Callable[[str], None] | None = None):
        self._clock = clock
        # Read at each pause, so a reload applies to the next stall.
        self._write_stall_s = write_stall_s
        self._client_stall_s = client_stall_s
        self._waiting = waiting
        self._counted = counted
        self._paused: dict = {}
        self._overdue: dict[str, dict] = {}

    @classmethod
    def for_router(cls, factory) -> StallWatch:
        """The watch of a ``RouterFactory``: its clients' limits, its dispatcher's queues, settings and metrics."""
        dispatcher = factory.dispatcher

        def client_stall_s() -> float | None:
            config = getattr(dispatcher, "config", None)
            return None if config is None else config.client_stall_s

        fair = getattr(factory.metrics, "fair", None)
        watch = cls(factory.clock, lambda: factory.clients.write_stall_timeout_s, client_stall_s,
                    getattr(dispatcher, "queue_depth", lambda model: 0), None if fair is None else fair.stall_cut)
        if hasattr(dispatcher, "waited"):
            dispatcher.waited = watch.waited
        return watch

    def __contains__(self, conn) -> bool:
        """Whether *conn*'s writes are paused now."""
        return conn in self._paused

    def __len__(self) -> int:
        return len(self._paused)

    def paused(self, conn) -> None:
        """*conn*'s client stopped reading: its buffer is full."""
        if conn in self._paused:
            return
        clock = self._clock
        stall = self._paused[conn] = _Stall(clock.seconds())
        stall.write_timer = clock.callLater(self._write_stall_s(), self._write_due, conn)
        seconds = self._client_stall_s()
        model = held_model(conn)
        if seconds is not None and model is not None:
            stall.model = model
            stall.slot_timer = clock.callLater(seconds, self._slot_due, conn)

    def resumed(self, conn) -> None:
        """*conn*'s client read again, or the connection is gone."""
        stall = self._paused.pop(conn, None)
        if stall is None:
            return
        for timer in (stall.write_timer, stall.slot_timer):
            if timer is not None and timer.active():
                timer.cancel()
        if stall.model is not None:
            overdue = self._overdue.get(stall.model)
            if overdue is not None:
                overdue.pop(conn, None)
                if not overdue:
                    del self._overdue[stall.model]

    def waited(self, model: str) -> None:
        """A request of *model* began waiting for a slot: every stream of it stalled past the limit is cut now."""
        overdue = self._overdue.pop(model, None)
        if overdue:
            for conn in list(overdue):
                self._cut(conn)

    def _write_due(self, conn) -> None:
        self._paused[conn].write_timer = None
        self.resumed(conn)
        conn.write_stalled()

    def _slot_due(self, conn) -> None:
        stall = self._paused[conn]
        stall.slot_timer = None
        if held_model(conn) != stall.model:
            return
        if self._waiting(stall.model) > 0:
            self._cut(conn)
        else:
            self._overdue.setdefault(stall.model, {})[conn] = None

    def _cut(self, conn) -> None:
        stall = self._paused[conn]
        model, seconds = stall.model, self._clock.seconds() - stall.since
        self.resumed(conn)
        if model is None or held_model(conn) != model:
            return
        lease = conn.exchange.lease
        key = getattr(lease, "key", None)
        peer = conn.transport.getPeer()
        log.info("{peer} (API key {key}) read none of its stream of {model} (request {request_id}) for {s:.1f} s "
                 "while {n} requests waited for a slot of it (router.client_stall_s): cut, its engine slot freed",
                 peer="%s:%s" % (getattr(peer, "host", peer), getattr(peer, "port", "")),
                 key="none" if key is None else repr(key.name), model=model,
                 request_id=conn.exchange.info.request_id, s=seconds, n=self._waiting(model))
        if self._counted is not None:
            self._counted(model)
        conn.transport.abortConnection()
