"""The simulated engine: routes, admission, pacing, failure injection, accounting.

A request that needs no waiting (no --ttft-ms, no --tokens-per-s, a free slot)
is answered inside ``handle`` without a task or a timer: that is the path a
router benchmark exercises, and it has to stay cheap.  Anything that waits
runs as a coroutine the connection owns; when the client goes away the
connection cancels it, and the cancellation is counted as an abort.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import sys
import time
from collections import deque
from typing import Callable, Coroutine, TextIO

from llmgw.sim import api, pooling
from llmgw.sim.api import CHAT, COMPLETION, EMBEDDING, ApiError
from llmgw.sim.connection import HTTPConnection
from llmgw.http11 import EVENT_STREAM, BadRequest, ParsedRequest
from llmgw.sim.metrics import CONTENT_TYPE as METRICS_TYPE
from llmgw.sim.metrics import SimMetrics
from llmgw.sim.options import SimOptions

_HEALTH_OK = b'{"status":"ok"}'
_HEALTH_LOADING = b'{"status":"loading"}'


class Job:
    """One inference request between admission and its last byte."""

    __slots__ = ("kind", "request", "embedding", "stream", "include_usage", "prompt_tokens", "words", "n", "finish", "inputs", "started",
                 "start")

    def __init__(self, kind: str, request: ParsedRequest, started: float):
        self.kind = kind
        self.request = request
        self.started = started
        self.stream = False
        self.include_usage = False
        self.prompt_tokens = 0
        self.words: list[str] = []
        self.n = 0
        # A continued reply's first token (api.continued_from); 0 for a new one.
        self.start = 0
        self.finish = "stop"
        self.inputs: list[tuple[int, bytes]] = []
        self.embedding = (0, False)  # (dimensions, base64?)


class SimEngine:
    def __init__(
        self,
        options: SimOptions,
        *,
        port: int,
        out: TextIO = sys.stdout,
        on_exit: Callable[[int], None] = lambda code: None,
        clock: Callable[[], float] = time.time,
    ):
        self.options = options
        self.metrics = SimMetrics(options.model)
        self.ready = options.startup_delay_ms <= 0
        self.stopping = False
        self.running = 0
        # Tokens held by running requests: their prompts and what they generated so far.
        self.cache_tokens = 0
        self._waiters: deque[asyncio.Future] = deque()
        self._limit = options.max_concurrency
        self._answered = 0
        self._exiting = False
        self._on_exit = on_exit
        self._clock = clock
        self._out = out
        self._log = options.log_requests
        self._log_polls = options.log_requests and options.log_polls
        self._rng = random.Random(options.seed)
        self._waits = options.ttft_ms > 0 or options.tokens_per_s > 0
        self._ttft = options.ttft_ms / 1000.0
        self._tps = options.tokens_per_s
        # Ids unique across the replicas of a fleet, so a router test can tell responses apart.
        self._id_prefix = os.urandom(4).hex()
        self._ids = itertools.count(1)
        self.renderer = api.Renderer(options.model, f"llmgw-sim-{port}", int(clock()))
        self._routes: dict[str, dict[str, Callable[[HTTPConnection, ParsedRequest], Coroutine | None]]] = {
            "/v1/chat/completions": {"POST": self._chat},
            "/v1/completions": {"POST": self._completions},
            "/v1/embeddings": {"POST": self._embeddings},
            "/v1/models": {"GET": self._models},
            "/health": {"GET": self._health},
            "/metrics": {"GET": self._metrics},
        }
        for path in pooling.ROUTES:
            self._routes[path] = {"POST": self._pooling}
        self._vocabulary = pooling.Vocabulary()

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self.ready:
            loop.call_later(self.options.startup_delay_ms / 1000.0, self._become_ready)

    def _become_ready(self) -> None:
        self.ready = True
        self.say(f"sim: {self.options.model} is ready")

    def say(self, line: str) -> None:
        self._out.write(line + "\n")

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @property
    def cache_usage(self) -> float:
        return min(1.0, self.cache_tokens / self.options.kv_cache_tokens)

    # The application the connections call

    def handle(self, conn: HTTPConnection, request: ParsedRequest) -> Coroutine | None:
        route = self._routes.get(request.path)
        if route is None:
            if request.path.startswith("/v1/models/"):
                return self._model(conn, request)
            return self._error(conn, request, ApiError(404, f"Invalid URL ({request.method} {request.path})"), time.perf_counter())
        handler = route.get(request.method)
        if handler is None:
            allow = ", ".join(route)
            return self._error(
                conn,
                request,
                ApiError(405, f"{request.path} accepts {allow}, not {request.method}", headers=b"Allow: %s\r\n" % allow.encode()),
                time.perf_counter(),
            )
        return handler(conn, request)

    def bad_request(self, conn: HTTPConnection, error: BadRequest) -> None:
        self.metrics.count(error.status)
        conn.respond(error.status, api.error_body(error.message, "invalid_request_error"), close=True)
        if self._log:
            self.say(f"sim: {conn.peer} - {error.status} {error.message}")

    # Small endpoints

    def _error(self, conn: HTTPConnection, request: ParsedRequest, error: ApiError, started: float) -> None:
        self.metrics.count(error.status)
        conn.respond(error.status, error.body(), extra=error.headers)
        if self._log:
            self._log_line(conn, request, error.status, started, error.message)

    def _health(self, conn: HTTPConnection, request: ParsedRequest) -> None:
        status = 200 if self.ready else 503
        conn.respond(status, _HEALTH_OK if self.ready else _HEALTH_LOADING)
        if self._log_polls:
            self._log_line(conn, request, status, None, "")

    def _metrics(self, conn: HTTPConnection, request: ParsedRequest) -> None:
        body = self.metrics.render(running=self.running, waiting=self.waiting, cache_usage=self.cache_usage)
        conn.respond(200, body, content_type=METRICS_TYPE)
        if self._log_polls:
            self._log_line(conn, request, 200, None, "")

    def _models(self, conn: HTTPConnection, request: ParsedRequest) -> None:
        self.metrics.count(200)
        conn.respond(200, self.renderer.models)
        if self._log:
            self._log_line(conn, request, 200, None, "")

    def _model(self, conn: HTTPConnection, request: ParsedRequest) -> None:
        started = time.perf_counter()
        if request.method != "GET":
            return self._error(conn, request, ApiError(405, f"{request.path} accepts GET, not {request.method}", headers=b"Allow: GET\r\n"), started)
        name = request.path[len("/v1/models/"):]
        if name != self.options.model:
            return self._error(conn, request, ApiError(404, f"The model `{name}` does not exist.", param="model", code="model_not_found"), started)
        self.metrics.count(200)
        conn.respond(200, json.dumps(self.renderer.model_object()).encode())
        if self._log:
            self._log_line(conn, request, 200, started, "")

    def _pooling(self, conn: HTTPConnection, request: ParsedRequest) -> None:
        """Rerank, score, tokenize, detokenize: answered at once, without a slot (``llmgw.sim.pooling``)."""
        started = time.perf_counter()
        path = request.path
        try:
            if not self.ready:
                raise ApiError(503, f"{self.options.model} is loading", type="unavailable_error", code="model_loading",
                               headers=b"Retry-After: 1\r\n")
            payload = api.load_json(request.body)
            api.check_model(payload, self.options.model)
            model, created = self.options.model, int(self._clock())
            if path in pooling.RERANK:
                body = pooling.rerank(payload, model, "rerank-%s%d" % (self._id_prefix, next(self._ids)))
            elif path in pooling.SCORE:
                body = pooling.score(payload, model, "score-%s%d" % (self._id_prefix, next(self._ids)), created)
            elif path in pooling.TOKENIZE:
                body = pooling.tokenize(payload, self._vocabulary)
            else:
                body = pooling.detokenize(payload, self._vocabulary)
        except ApiError as e:
            return self._error(conn, request, e, started)
        self.metrics.count(200)
        conn.respond(200, body)
        if self._log:
            self._log_line(conn, request, 200, started, "")

    # Inference

    def _chat(self, conn: HTTPConnection, request: ParsedRequest) -> Coroutine | None:
        return self._inference(conn, request, CHAT)

    def _completions(self, conn: HTTPConnection, request: ParsedRequest) -> Coroutine | None:
        return self._inference(conn, request, COMPLETION)

    def _embeddings(self, conn: HTTPConnection, request: ParsedRequest) -> Coroutine | None:
        return self._inference(conn, request, EMBEDDING)

    def _inference(self, conn: HTTPConnection, request: ParsedRequest, kind: str) -> Coroutine | None:
        job = Job(kind, request, time.perf_counter())
        try:
            if not self.ready:
                raise ApiError(
                    503,
                    f"{self.options.model} is loading",
                    type="unavailable_error",
                    code="model_loading",
                    headers=b"Retry-After: 1\r\n",
                )
            payload = api.load_json(request.body)
            api.check_model(payload, self.options.model)
            if kind == EMBEDDING:
                job.inputs = api.embedding_inputs(payload)
                job.prompt_tokens = sum(tokens for tokens, _ in job.inputs)
                job.embedding = api.embedding_format(payload, self.options.embedding_dims)
            else:
                job.prompt_tokens, job.words = (api.chat_prompt if kind == CHAT else api.completion_prompt)(payload)
                if kind == CHAT:
                    job.start = api.continued_from(payload)
                job.stream, job.include_usage = api.stream_flags(payload)
                cap = api.token_cap(payload)
                job.n = max(0, self.options.output_tokens - job.start)
                if cap is not None and cap < job.n:
                    job.n = cap
                    job.finish = "length"
            if self.options.fail_rate and self._rng.random() < self.options.fail_rate:
                raise ApiError(500, "simulated failure (--fail-rate)", type="server_error", code="simulated_failure")
        except ApiError as e:
            self._error(conn, request, e, job.started)
            self._answered_one()
            return None
        if not self._waits and (self._limit is None or self.running < self._limit):
            self._answer_now(conn, job)
            self._answered_one()
            return None
        return self._answer_later(conn, job)

    def _next_id(self, kind: str) -> str:
        return "%s-%s%d" % ("chatcmpl" if kind == CHAT else "cmpl", self._id_prefix, next(self._ids))

    def _answer_now(self, conn: HTTPConnection, job: Job) -> None:
        metrics = self.metrics
        metrics.prompt_tokens += job.prompt_tokens
        if job.kind == EMBEDDING:
            self._send_embeddings(conn, job)
            return
        metrics.generation_tokens += job.n
        metrics.count(200)
        created = int(self._clock())
        rid = self._next_id(job.kind)
        if job.stream:
            events = self.renderer.stream(job.kind, rid, created, job.include_usage)
            # Every token is ready at once: one write, each event still its own chunk.
            parts = events.tokens(job.words, job.start, job.start + job.n)
            if events.opening:
                parts.insert(0, events.opening)
            parts.append(events.closing(job.finish, job.prompt_tokens, job.n))
            conn.stream_whole(200, EVENT_STREAM, parts)
        else:
            text = api.reply_text(job.words, job.n, job.start)
            conn.respond(200, self.renderer.whole(job.kind, rid, created, text, job.finish, job.prompt_tokens, job.n))
        if self._log:
            self._log_line(conn, job.request, 200, job.started, self._tokens_note(job, job.n))

    def _send_embeddings(self, conn: HTTPConnection, job: Job) -> None:
        dims, b64 = job.embedding
        vectors = [api.embedding_vector(identity, dims) for _, identity in job.inputs]
        self.metrics.count(200)
        conn.respond(200, self.renderer.embeddings(vectors, b64, job.prompt_tokens))
        if self._log:
            self._log_line(conn, job.request, 200, job.started, f"prompt={job.prompt_tokens} inputs={len(job.inputs)}")

    async def _answer_later(self, conn: HTTPConnection, job: Job) -> None:
        loop = asyncio.get_running_loop()
        emitted = 0
        admitted = False
        events = None
        try:
            if job.stream:
                # Like vLLM: the head goes out at once, tokens when they are made.
                events = self.renderer.stream(job.kind, self._next_id(job.kind), int(self._clock()), job.include_usage)
                self.metrics.count(200)
                conn.start_stream(200, EVENT_STREAM)
            await self._acquire()
            admitted = True
            self.cache_tokens += job.prompt_tokens
            self.metrics.prompt_tokens += job.prompt_tokens
            first = loop.time() + self._ttft
            if self._ttft:
                await asyncio.sleep(self._ttft)
            if job.kind == EMBEDDING:
                self._send_embeddings(conn, job)
                return
            while emitted < job.n:
                if self._tps:
                    due = min(job.n, int((loop.time() - first) * self._tps + 1e-6) + 1)
                else:
                    due = job.n
                if due > emitted:
                    if events is not None:
                        parts = events.tokens(job.words, job.start + emitted, job.start + due)
                        if emitted == 0 and events.opening:
                            parts.insert(0, events.opening)
                        conn.send_all(parts)
                    self.cache_tokens += due - emitted
                    self.metrics.generation_tokens += due - emitted
                    emitted = due
                    if events is not None:
                        await conn.drain()
                if emitted < job.n:
                    await asyncio.sleep(max(0.0, first + emitted / self._tps - loop.time()))
            if events is not None:
                conn.send(events.closing(job.finish, job.prompt_tokens, job.n))
                conn.end_stream()
            else:
                text = api.reply_text(job.words, job.n, job.start)
                self.metrics.count(200)
                rid = self._next_id(job.kind)
                conn.respond(200, self.renderer.whole(job.kind, rid, int(self._clock()), text, job.finish, job.prompt_tokens, job.n))
            if self._log:
                self._log_line(conn, job.request, 200, job.started, self._tokens_note(job, job.n))
        except asyncio.CancelledError:
            if conn.lost and not self.stopping:
                self.metrics.aborted += 1
                if self._log:
                    self._log_line(conn, job.request, None, job.started, f"aborted after {emitted} of {job.n} tokens")
            raise
        finally:
            if admitted:
                self.cache_tokens -= job.prompt_tokens + emitted
                self._release()
            self._answered_one()

    @staticmethod
    def _tokens_note(job: Job, completion: int) -> str:
        return f"prompt={job.prompt_tokens} completion={completion}" + (" stream" if job.stream else "")

    # Slots (--max-concurrency): first come, first served

    async def _acquire(self) -> None:
        if self._limit is None or (self.running < self._limit and not self._waiters):
            self.running += 1
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter  # _release hands its slot over: running stays as it is
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._release()
            else:
                self._waiters.remove(waiter)
            raise

    def _release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.running -= 1

    # Failure injection and logs

    def _answered_one(self) -> None:
        self._answered += 1
        fail_after = self.options.fail_after
        if fail_after is not None and self._answered >= fail_after and not self._exiting:
            self._exiting = True
            self.say(f"sim: exiting with code 1 after {self._answered} requests (--fail-after {fail_after})")
            self._on_exit(1)

    def _log_line(
        self, conn: HTTPConnection, request: ParsedRequest, status: int | None, started: float | None, note: str
    ) -> None:
        parts = ["sim:", conn.peer, request.method, request.path, "-" if status is None else str(status)]
        if note:
            parts.append(note)
        if started is not None:
            parts.append("%.1fms" % ((time.perf_counter() - started) * 1000))
        self.say(" ".join(parts))
