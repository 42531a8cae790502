"""What every autobahn session llmgw puts on the link shares, local or remote.

autobahn reports a handler whose Deferred was cancelled (the caller
cancelled, or the call timed out and the hub interrupted it) as a user
error, at error level with a traceback, once per cancelled call.  A
cancellation is the caller's decision, not the callee's failure: the hub
logs it in one info line, and the callee says nothing above debug.

Both ends ping a quiet link (autobahn's auto-ping) to find a peer that
lost power, but a peer whose messages keep arriving is not dead: a node's
heartbeat every few seconds already says so.  ``PingWhenQuiet`` sends the
ping only when nothing arrived for a whole interval, so a busy fleet's
links carry their heartbeats and not twice as many ping and pong frames;
and ``QuietSweep`` waits for that interval with one timer per process
rather than one per link.
"""

from __future__ import annotations

import json
import pprint
import secrets
import time
import weakref

from autobahn.wamp.serializer import JsonObjectSerializer, JsonSerializer, Serializer, _WAMPJsonEncoder
from autobahn.websocket import protocol as _ws_protocol
from autobahn.websocket.protocol import WebSocketProtocol
from twisted.internet import defer
from twisted.logger import Logger

from llmgw.wire import JsonText

log = Logger()

_autobahn_ping = WebSocketProtocol._sendAutoPing


class WhenLogged:
    """pprint's text of a value, made only if the line it is for is written."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __format__(self, spec: str) -> str:
        return format(pprint.pformat(self.value), spec)

    def __str__(self) -> str:
        return pprint.pformat(self.value)


# autobahn's ``WebSocketProtocol._connectionMade`` pretty-prints every option
# of the protocol for a debug line on every connection, whether the line is
# logged or not: 3 % of a restarted server's time while its fleet came back
# (py-spy, bench/fleet.py at 10,000 nodes), and as much in each agent.  Its
# module's ``pformat`` is the only way in short of copying the method; its
# one other caller, ``Timings.__str__``, must still give a string.
_ws_protocol.pformat = WhenLogged
_ws_protocol.Timings.__str__ = lambda self: pprint.pformat(self._timings)


class _CJsonObjectSerializer(JsonObjectSerializer):
    """autobahn's JSON, read by Python's C scanner instead of its pure-Python one.

    autobahn swaps in ``json.scanner.py_make_scanner`` so that a string
    starting with NUL can decode to bytes (WAMP's binary convention).  llmgw
    sends no binary, and the price was every message a client reads: 0.8 s of
    a ctl or TUI's time for the 15 MB list of 10,000 nodes, and most of a
    simulated agent's per heartbeat.  A NUL-prefixed string stays a string
    here, which is also what the hub's own reader (``inbound.decode``) does.
    """

    def unserialize(self, payload):
        if self._batched:
            return super().unserialize(payload)
        return [json.loads(payload)]

    def serialize(self, obj):
        if self._batched:
            return super().serialize(obj)
        try:
            # Most messages hold only JSON's own types: one encoder made once.
            return _PLAIN.encode(obj).encode("utf8")
        except _NotPlain:
            pass
        encoder = _SplicingEncoder(separators=(",", ":"), ensure_ascii=False, sort_keys=False)
        text = encoder.encode(obj).encode("utf8")
        return encoder.splice(text) if encoder.texts else text


class _NotPlain(Exception):
    """A value JSON has no type for (a ``JsonText``, bytes): the message is written by ``_SplicingEncoder``."""


def _not_plain(obj):
    raise _NotPlain


# What autobahn's encoder writes for JSON's own types, without a Python
# encoder object made for each message.
_PLAIN = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, sort_keys=False, default=_not_plain)


class _SplicingEncoder(_WAMPJsonEncoder):
    """autobahn's JSON encoder, which also writes a ``JsonText`` as the text it holds.

    The C encoder cannot emit raw text, so each ``JsonText`` is written as a
    placeholder string first, then replaced: a NUL, a random token drawn for
    this message, and its number.  JSON always escapes the NUL, and no peer
    can know the token, so no string a peer sent can be taken for one.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.texts: list[bytes] = []
        self._token = ""

    def default(self, obj):
        if type(obj) is JsonText:
            if not self._token:
                self._token = secrets.token_hex(8)
            self.texts.append(obj.text)
            return f"\x00llmgw.json-text.{self._token}.{len(self.texts) - 1}"
        return super().default(obj)

    def splice(self, text: bytes) -> bytes:
        for i, raw in enumerate(self.texts):
            text = text.replace(f'"\\u0000llmgw.json-text.{self._token}.{i}"'.encode(), raw, 1)
        return text


class LinkJsonSerializer(JsonSerializer):
    """``wamp.2.json`` as autobahn writes it, read with the C scanner (``_CJsonObjectSerializer``)."""

    def __init__(self):
        Serializer.__init__(self, _CJsonObjectSerializer())


def quiet_cancellations(session):
    """*session*, its ``onUserError`` made to pass over cancelled handlers; other errors are reported as before."""
    loud = session.onUserError

    def onUserError(fail, msg):
        if getattr(fail, "check", None) is not None and fail.check(defer.CancelledError):
            log.debug("{session}: a handler was cancelled by its caller", session=type(session).__name__)
            return
        loud(fail, msg)

    session.onUserError = onUserError
    return session


class QuietSweep:
    """One timer per reactor that pings the links of that process which went quiet.

    autobahn gives every connection its own auto-ping timer, re-armed after
    each ping; at ten thousand links that is a timer per link every interval,
    most of them only to find the link was not quiet.  Here a link's
    ``_sendAutoPing`` is not scheduled: the link joins the sweep, which every
    quarter interval pings those that heard nothing for a whole interval
    (autobahn's own ``_sendAutoPing``, its timeout and all), so a quiet link
    is pinged between one and one and a quarter intervals after it last
    heard, and a busy one costs a comparison per sweep.
    """

    _of: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __init__(self, clock, interval: float):
        self._clock = weakref.ref(clock)
        self.interval = interval
        self._links: dict = {}
        self._timer = None

    @classmethod
    def of(cls, clock, interval: float) -> QuietSweep:
        """The sweep of *clock* for links pinged every *interval* seconds."""
        sweeps = cls._of.setdefault(clock, {})
        sweep = sweeps.get(interval)
        if sweep is None:
            sweep = sweeps[interval] = cls(clock, interval)
        return sweep

    def join(self, link) -> _InSweep:
        clock = self._clock()
        if not link._heard_at:
            link._heard_at = clock.seconds()  # opening counts as hearing from it
        self._links[link] = None
        if self._timer is None:
            self._timer = clock.callLater(self.interval / 4, self._sweep)
        return _InSweep(self, link)

    def leave(self, link) -> None:
        self._links.pop(link, None)

    def _sweep(self) -> None:
        self._timer = None
        clock = self._clock()
        if clock is None:
            return
        now = clock.seconds()
        quiet = [link for link in self._links if now - link._heard_at >= self.interval]
        for link in quiet:
            del self._links[link]
            link.autoPingPendingCall = None
            try:
                _autobahn_ping(link)
            except Exception:
                log.failure("pinging a quiet link")
        if self._links:
            self._timer = clock.callLater(self.interval / 4, self._sweep)


class _InSweep:
    """What autobahn keeps as ``autoPingPendingCall`` while its link is in a sweep: cancelling it leaves the sweep."""

    __slots__ = ("_sweep", "_link")

    def __init__(self, sweep: QuietSweep, link):
        self._sweep, self._link = sweep, link

    def cancel(self) -> None:
        self._sweep.leave(self._link)


class _SweepTimer:
    """A factory's ``_batched_timer`` that puts auto-pings in the sweep and passes every other timer on."""

    def __init__(self, real, clock):
        self._real = real
        self._clock = clock

    def call_later(self, delay, func, *args, **kwargs):
        link = getattr(func, "__self__", None)
        if isinstance(link, PingWhenQuiet) and getattr(func, "__name__", None) == "_sendAutoPing":
            return QuietSweep.of(self._clock, link.autoPingInterval).join(link)
        return self._real.call_later(delay, func, *args, **kwargs)


def sweep_pings(factory) -> None:
    """Make *factory*'s links (its protocol mixes in ``PingWhenQuiet``) pinged by their reactor's sweep."""
    factory._batched_timer = _SweepTimer(factory._batched_timer, factory.reactor)


class NoDelay:
    """Mixed into an autobahn WebSocket protocol: its TCP connection sends each message at once (``TCP_NODELAY``).

    autobahn asks for ``TCP_NODELAY`` in ``connectionMade`` before it has
    copied its factory's ``tcpNoDelay`` option onto the protocol, so the
    attribute is missing, the call fails and is passed over, and every link
    kept Nagle's algorithm: the last part of an answer waited for the
    peer's delayed acknowledgement, up to 40 ms on Linux, whenever an
    earlier part was not yet acknowledged (a page of the node list, a
    result behind an invocation).  Through TLS and the hub's connection
    budget the wrappers hand the call down to the TCP transport.
    """

    def connectionMade(self) -> None:
        try:
            self.transport.setTcpNoDelay(True)
        except (AttributeError, OSError):  # not TCP: a UNIX socket, a test's transport in memory
            pass
        super().connectionMade()


class PingWhenQuiet:
    """Mixed into an autobahn WebSocket protocol: ``heard()`` on every message; a ping only after a quiet interval.

    With its factory passed to ``sweep_pings``, the wait is the reactor's
    ``QuietSweep``, not a timer per link; the ping, when due, and its
    timeout are autobahn's.
    """

    _heard_at = 0.0

    def _now(self) -> float:
        clock = getattr(self.factory, "reactor", None)
        return clock.seconds() if clock is not None else time.monotonic()

    def heard(self) -> None:
        self._heard_at = self._now()

    def _sendAutoPing(self) -> None:
        # Reached only from a factory not given to sweep_pings (autobahn's own timer).
        quiet = self._now() - self._heard_at
        if self.autoPingInterval and quiet < self.autoPingInterval:
            self.autoPingPendingCall = self.factory._batched_timer.call_later(
                self.autoPingInterval - quiet, self._sendAutoPing)
            return
        super()._sendAutoPing()
