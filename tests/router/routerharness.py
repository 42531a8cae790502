"""A router listening in the test's reactor, in front of real sim processes, and a tiny dispatcher for it.

``StaticDispatcher`` admits every request at once onto a fixed list of
endpoints, round robin, and records what the request path told it (every
lease's usage, outcome and retries), so tests can see the contract being kept.
``bench/router_hotpath.py`` uses it too.
"""

from __future__ import annotations

import socket

import attrs
from twisted.internet import defer, protocol, reactor

from llmgw.router import errors
from llmgw.router.server import RouterFactory
from tests.support.net import connect, free_port, read_response
from tests.support.sim import MODEL, SimProcess


@attrs.frozen
class StaticEndpoint:
    id: str
    host: str
    port: int


class StaticLease:
    def __init__(self, dispatcher: StaticDispatcher, endpoint: StaticEndpoint, model: str, tried: list[StaticEndpoint]):
        self.dispatcher = dispatcher
        self.endpoint = endpoint
        self.model = model
        self.tried = tried
        self.tokens: tuple[int | None, int | None] | None = None
        self.outcome: str | None = None

    def usage(self, prompt_tokens, completion_tokens) -> None:
        assert self.outcome is None, "usage after release"
        self.tokens = (prompt_tokens, completion_tokens)

    def release(self, outcome: str) -> None:
        assert self.outcome is None, f"released twice: {self.outcome} then {outcome}"
        assert outcome in ("ok", "error", "client_gone", "upstream_failed"), outcome
        self.outcome = outcome
        self.dispatcher.inflight -= 1
        self.dispatcher.events.append(("release", self.endpoint.id, outcome))

    def retry(self):
        assert self.outcome == "upstream_failed", "retry before release('upstream_failed')"
        tried = [*self.tried, self.endpoint]
        left = [e for e in self.dispatcher.endpoints if e not in tried]
        self.dispatcher.events.append(("retry", self.endpoint.id, left[0].id if left else None))
        if not left:
            return None
        return defer.succeed(self.dispatcher._lease(left[0], self.model, tried))


class StaticDispatcher:
    """Every request admitted at once, endpoints taken in turn; ``refuse[model]`` fails admission with that error."""

    def __init__(self, endpoints: list[StaticEndpoint], models: tuple[str, ...] = (MODEL,)):
        self.endpoints = endpoints
        self._models = list(models)
        self.refuse: dict[str, Exception] = {}
        self.holding = False  # when set, admission waits for let_in()
        self.held: list[tuple] = []
        self.requests = []
        self.leases: list[StaticLease] = []
        self.events: list[tuple] = []
        self.inflight = 0
        self.cancelled = 0
        self._next = 0

    def models(self) -> list[str]:
        return list(self._models)

    def admit(self, model, request):
        self.requests.append(request)
        if model in self.refuse:
            return defer.fail(self.refuse[model])
        if model not in self._models:
            return defer.fail(errors.UnknownModel(f"no model {model!r} is served here"))
        endpoint = self.endpoints[self._next % len(self.endpoints)]
        self._next += 1
        if self.holding:
            waiting = defer.Deferred(lambda d: self._cancelled())
            self.held.append((waiting, endpoint, model))
            return waiting
        return defer.succeed(self._lease(endpoint, model, []))

    def let_in(self) -> None:
        """Admit every request held since ``holding`` was set, and hold no more."""
        self.holding = False
        held, self.held = self.held, []
        for waiting, endpoint, model in held:
            if not waiting.called:
                waiting.callback(self._lease(endpoint, model, []))

    def _cancelled(self) -> None:
        self.cancelled += 1

    def _lease(self, endpoint, model, tried) -> StaticLease:
        lease = StaticLease(self, endpoint, model, tried)
        self.leases.append(lease)
        self.inflight += 1
        self.events.append(("admit", endpoint.id))
        return lease


def endpoint_of(sim: SimProcess, name: str | None = None) -> StaticEndpoint:
    return StaticEndpoint(name or f"sim:{sim.port}", "127.0.0.1", sim.port)


def dead_endpoint(name: str = "dead") -> StaticEndpoint:
    """An endpoint on a port nobody listens on."""
    return StaticEndpoint(name, "127.0.0.1", free_port())


class RecordingMetrics:
    def __init__(self):
        self.done: list[tuple] = []
        self.gone: list[str] = []
        self.upstream_errors: list[tuple] = []
        self.retries: list[str] = []
        self.client_timeouts: list[str] = []
        self.connections = 0
        self.refused = 0
        self.in_flight: dict[str, int] = {}
        self.relayed: list[tuple] = []
        self.bodies: list[tuple] = []
        self.rejected: list[tuple] = []

    def request_started(self, model):
        self.in_flight[model] = self.in_flight.get(model, 0) + 1

    def request_finished(self, model):
        self.in_flight[model] -= 1

    def bytes_relayed(self, model, direction, n):
        self.relayed.append((model, direction, n))

    def request_body(self, path, n):
        self.bodies.append((path, n))

    def admission_rejected(self, model, reason):
        self.rejected.append((model, reason))

    def request_done(self, model, path, status, seconds, ttft_seconds, prompt_tokens, completion_tokens):
        self.done.append((model, path, status, seconds, ttft_seconds, prompt_tokens, completion_tokens))

    def client_gone(self, model):
        self.gone.append(model)

    def upstream_error(self, model, endpoint_id, kind):
        self.upstream_errors.append((model, endpoint_id, kind))

    def retried(self, model):
        self.retries.append(model)

    def client_timeout(self, kind):
        self.client_timeouts.append(kind)

    def client_connections(self, n):
        self.connections = n

    def connection_refused(self):
        self.refused += 1


class Router:
    """A RouterFactory listening on 127.0.0.1 in this reactor."""

    def __init__(self, dispatcher: StaticDispatcher, *, max_body_bytes: int = 1 << 20, clock=None, **kw):
        """``clock``: a ``task.Clock`` for the router's timeouts (connections stay on the real reactor)."""
        self.dispatcher = dispatcher
        self.metrics = RecordingMetrics()
        self.clock = clock if clock is not None else reactor
        self.factory = RouterFactory(dispatcher, self.clock, max_body_bytes=max_body_bytes, metrics=self.metrics,
                                     reactor=reactor, **kw)
        # Every client connection's protocol, for tests that look at its transport.
        self.protocols = []
        build = self.factory.buildProtocol

        def build_and_keep(addr):
            p = build(addr)
            self.protocols.append(p)
            return p

        self.factory.buildProtocol = build_and_keep
        self.port = reactor.listenTCP(0, self.factory, interface="127.0.0.1")
        self.address = self.port.getHost().port
        self.base_url = f"http://127.0.0.1:{self.address}"

    async def stop(self) -> None:
        await self.port.stopListening()
        self.factory.close()


def exchange(port: int, raw: bytes, responses: int = 1, *, then_closed: bool = False):
    """Blocking (run it in a thread): send ``raw`` on a new connection, read ``responses`` responses.

    With ``then_closed``, also check that the router closed the connection after them.
    """
    with connect(port) as s:
        s.sendall(raw)
        f = s.makefile("rb")
        out = [read_response(f) for _ in range(responses)]
        if then_closed:
            assert f.read(1) == b"", "the router kept the connection open"
        return out if responses > 1 else out[0]


class GatedEngine:
    """A stand-in engine on 127.0.0.1 that answers only what the test writes, when it writes it.

    ``await engine.request()`` is the next request's connection once its bytes
    arrived; the test then writes to ``connection.transport`` (or never does).
    """

    def __init__(self):
        self._arrived: list = []
        self._waiting: list[defer.Deferred] = []
        gated = self

        class _Connection(protocol.Protocol):
            def dataReceived(self, data: bytes) -> None:
                gated._got(self)

        factory = protocol.Factory.forProtocol(_Connection)
        factory.noisy = False
        self.port = reactor.listenTCP(0, factory, interface="127.0.0.1")
        self.endpoint = StaticEndpoint(f"gated:{self.port.getHost().port}", "127.0.0.1", self.port.getHost().port)

    def _got(self, connection) -> None:
        if self._waiting:
            self._waiting.pop(0).callback(connection)
        else:
            self._arrived.append(connection)

    def request(self) -> defer.Deferred:
        if self._arrived:
            return defer.succeed(self._arrived.pop(0))
        d = defer.Deferred()
        self._waiting.append(d)
        return d

    async def stop(self) -> None:
        await self.port.stopListening()


def buffered(transport) -> int:
    """Bytes the router holds for a client: written to its transport, not yet taken by the kernel."""
    return len(transport.dataBuffer) - transport.offset + transport._tempDataLen


def slow_reader(port: int) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    return s


def chat(content: str = "hello there", **extra) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}
