"""Asking an engine whether it serves yet, and whether every rank of a multi-node replica joined.

Each question is bounded by the probe's deadline and answers True or False
(or, for the joins, a sentence saying what is still missing); none raises.
"""

from __future__ import annotations

import io
import json

from twisted.internet import defer, endpoints, protocol, threads
from twisted.web.client import Agent, FileBodyProducer
from twisted.web.http_headers import Headers

from llmgw.agent.procs import group_connected
from llmgw.engines.base import CompletionProbe, Connected, Joined, RayNodes, host_port
from llmgw.webclient import connection_pool

# A Ray head's answer is one short JSON line; more is not a head's answer.
RAY_ANSWER_BYTES = 64 * 1024


class HttpProbe:
    """GETs with a deadline and no connection reuse: a probe must not keep a
    socket open to an engine that is being stopped."""

    def __init__(self, reactor, clock, timeout_s: float):
        self._reactor = reactor
        self._clock = clock
        self._timeout_s = timeout_s
        self._agent = Agent(reactor, connectTimeout=timeout_s, pool=connection_pool(reactor, persistent=False))

    async def ok(self, url: str, body: bytes | None = None) -> bool:
        """True when *url* answers 200 within the deadline (a POST of JSON *body* when given); never raises."""
        try:
            headers = {b"User-Agent": [b"llmgw-agent"]}
            if body is not None:
                headers[b"Content-Type"] = [b"application/json"]
            request = self._agent.request(b"GET" if body is None else b"POST", url.encode("ascii"),
                                          Headers(headers), None if body is None else _body(body))
            request.addTimeout(self._timeout_s, self._clock)
            response = await request
            body = _Discard()
            response.deliverBody(body)
            body.done.addTimeout(self._timeout_s, self._clock)
            try:
                await body.done
            except (Exception, defer.CancelledError):
                pass
            return response.code == 200
        except (Exception, defer.CancelledError):
            return False


    async def accepts(self, host: str, port: int) -> bool:
        """True when *host*:*port* accepts a TCP connection within the deadline; the connection is closed at once."""
        endpoint = endpoints.TCP6ClientEndpoint if ":" in host else endpoints.TCP4ClientEndpoint
        try:
            d = endpoint(self._reactor, host, port, timeout=self._timeout_s).connect(_Knock())
            d.addTimeout(self._timeout_s, self._clock)
            connected = await d
        except (Exception, defer.CancelledError):
            return False
        connected.transport.loseConnection()
        return True


class Joins:
    """Whether every rank joined (asked on rank 0) or this rank joined (asked on a worker).

    ``missing`` is None once joined, else what this rank waits for, in words
    for the shard's status while it starts.
    """

    def __init__(self, reactor, clock, probe: HttpProbe, timeout_s: float):
        self._reactor = reactor
        self._clock = clock
        self._probe = probe
        self._timeout_s = timeout_s

    async def missing(self, joined: Joined, *, endpoint: str, pgid: int) -> str | None:
        if isinstance(joined, CompletionProbe):
            body = json.dumps({"model": joined.model, "prompt": "ping", "max_tokens": 1}).encode()
            if await self._probe.ok(f"{endpoint}{joined.path}", body):
                return None
            return f"waiting for every rank to join: a one-token completion at {joined.path} is not served yet"
        if isinstance(joined, Connected):
            d = threads.deferToThreadPool(self._reactor, self._reactor.getThreadPool(),
                                          group_connected, pgid, joined.host, joined.port)
            d.addTimeout(self._timeout_s, self._clock)
            try:
                if await d:
                    return None
            except (Exception, defer.CancelledError):
                pass
            return f"waiting to join rank 0 at {host_port(joined.host, joined.port)}: no connection to it yet"
        return await self._ray(joined)

    async def _ray(self, joined: RayNodes) -> str | None:
        from llmgw.agent.engines.pip import run_bounded

        head = joined.head
        try:
            output = await run_bounded(self._reactor, self._clock, joined.argv, timeout_s=self._timeout_s)
            answer = json.loads(output.strip().splitlines()[-1][:RAY_ANSWER_BYTES])
            alive, ports = answer["alive"], answer["ports"]
            if not isinstance(alive, int) or not isinstance(ports, list):
                raise ValueError(answer)
        except (Exception, defer.CancelledError) as e:
            return f"waiting for the Ray head at {head} to answer: {str(e)[:300]}"
        if joined.node_manager_port is not None:
            if joined.node_manager_port in ports:
                return None
            return f"waiting to register with the Ray head at {head}: it lists {alive} nodes, not this one"
        if alive >= joined.count:
            return None
        return f"waiting for {joined.count} Ray nodes: the head at {head} sees {alive}"


def _body(body: bytes) -> FileBodyProducer:
    return FileBodyProducer(io.BytesIO(body))


class _Knock(protocol.Factory):
    """Connects and nothing more, without a log line per attempt: it knocks every health interval."""

    noisy = False
    protocol = protocol.Protocol


class _Discard(protocol.Protocol):
    """Reads a body to its end and forgets it: only the status code matters."""

    def __init__(self):
        self.done: defer.Deferred = defer.Deferred()

    def connectionLost(self, reason):
        if not self.done.called:
            self.done.callback(None)
