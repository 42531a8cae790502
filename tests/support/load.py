"""Many streaming chat clients at once through the router, from one thread, each request's fate written down.

The clients are raw HTTP/1.1 on asyncio rather than the openai package in
threads: on a two-core machine 32 openai clients spend more CPU parsing
their chunks than the router spends relaying them (``bench_clients`` below
measures both), and the figures are meant to be the router's.  Each request
is a fresh connection with ``Connection: close``, so a fault never leaves a
kept-alive connection to be found dead by the next request.

A request succeeded when it got 200 and the stream's ``data: [DONE]``.
Anything else failed, and is told apart by whether any event of the answer
had arrived: an engine that dies mid-answer can only cut the client off,
while one that fails before its first byte leaves the router free to try
another.  The sim starts every completion id with a prefix drawn at its
start (``chatcmpl-<8 hex><n>``), which says which engine process answered.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import attrs

#: Any request that takes longer than this is given up on and counted failed.
REQUEST_TIMEOUT_S = 15.0


@attrs.frozen
class Outcome:
    """One request: when it began and ended (time.monotonic), what arrived, and how it ended."""

    started: float
    ended: float
    first_byte: float | None  # the first event of the stream, None if none came
    engine: str | None  # the sim's id prefix of the first event
    ok: bool
    error: str | None = None
    client: int | None = None  # which of the Load's clients sent it

    @property
    def had_bytes(self) -> bool:
        return self.first_byte is not None


def engine_of(completion_id: str) -> str | None:
    """The sim process a completion id came from: its 8 hex digits after ``chatcmpl-``."""
    kind, _, rest = completion_id.partition("-")
    return rest[:8] if kind in ("chatcmpl", "cmpl") and len(rest) > 8 else None


class _Stream:
    """What one response's events said so far."""

    def __init__(self):
        self.buffer = b""
        self.first_byte: float | None = None
        self.engine: str | None = None
        self.done = False

    def feed(self, data: bytes) -> None:
        self.buffer += data
        while b"\n\n" in self.buffer:
            event, self.buffer = self.buffer.split(b"\n\n", 1)
            if not event.startswith(b"data: "):
                continue
            payload = event[len(b"data: "):]
            if payload == b"[DONE]":
                self.done = True
                continue
            if self.first_byte is None:
                self.first_byte = time.monotonic()
                try:
                    self.engine = engine_of(json.loads(payload).get("id", ""))
                except (ValueError, AttributeError):
                    self.engine = None


async def _one(host: str, port: int, body: bytes, timeout_s: float = REQUEST_TIMEOUT_S) -> Outcome:
    started = time.monotonic()
    stream = _Stream()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    writer = None
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(head + body)
            status_line, *fields = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            status = int(status_line.split()[1])
            headers = {k.strip().lower(): v.strip() for k, _, v in (f.partition(":") for f in fields if f)}
            if status != 200:
                raise _Failed(f"HTTP {status}: {(await reader.read(300)).decode(errors='replace')}")
            if headers.get("transfer-encoding") == "chunked":
                while True:
                    size = int((await reader.readline()).split(b";")[0], 16)
                    if size == 0:
                        break
                    stream.feed(await reader.readexactly(size))
                    await reader.readexactly(2)
            else:
                while data := await reader.read(65536):
                    stream.feed(data)
            if not stream.done:
                raise _Failed("the stream ended without data: [DONE]")
        return Outcome(started, time.monotonic(), stream.first_byte, stream.engine, True)
    except TimeoutError:
        return Outcome(started, time.monotonic(), stream.first_byte, stream.engine, False,
                       f"no whole answer within {timeout_s:g} s")
    except (OSError, EOFError, ValueError, IndexError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
            _Failed) as e:
        error = str(e) or type(e).__name__
        return Outcome(started, time.monotonic(), stream.first_byte, stream.engine, False, error)
    finally:
        if writer is not None:
            writer.close()


class _Failed(Exception):
    pass


class Load:
    """*clients* loops, each sending one streaming chat request after another to *port* until ``stop()``."""

    def __init__(self, port: int, model: str, clients: int = 32, host: str = "127.0.0.1",
                 timeout_s: float = REQUEST_TIMEOUT_S):
        self.host, self.port, self.clients, self.timeout_s = host, port, clients, timeout_s
        self.body = json.dumps({"model": model, "stream": True,
                                "messages": [{"role": "user", "content": "tell me a story"}]}).encode()
        self.outcomes: list[Outcome] = []
        self._stopping = False
        self._thread: threading.Thread | None = None

    def start(self) -> Load:
        self._thread = threading.Thread(target=asyncio.run, args=(self._run(),), name="load", daemon=True)
        self._thread.start()
        return self

    async def _run(self) -> None:
        await asyncio.gather(*(self._client(n) for n in range(self.clients)))

    async def _client(self, n: int) -> None:
        while not self._stopping:
            outcome = attrs.evolve(await _one(self.host, self.port, self.body, self.timeout_s), client=n)
            self.outcomes.append(outcome)
            if not outcome.ok:
                # A refused connection comes back at once; do not spin on it.
                await asyncio.sleep(0.05)

    def stop(self) -> list[Outcome]:
        """Let every client finish the request it is on, then return every outcome."""
        self._stopping = True
        if self._thread is not None:
            self._thread.join(self.timeout_s + 10)
            assert not self._thread.is_alive(), "the load's clients did not stop"
        return list(self.outcomes)

    def ok_since(self, moment: float) -> list[Outcome]:
        return [o for o in list(self.outcomes) if o.ok and o.started >= moment]

    def clients_done_since(self, moment: float) -> int:
        """How many clients have finished a request begun after *moment*: let go of what they had open then."""
        return len({o.client for o in list(self.outcomes) if o.started >= moment})

    def engines_since(self, moment: float) -> set[str]:
        """The engines that answered requests begun after *moment*."""
        return {o.engine for o in self.ok_since(moment) if o.engine}


def bench_clients(url: str, model: str, requests: int = 200, clients: int = 32) -> dict[str, float]:
    """CPU seconds this process spends per streamed request, raw asyncio against the openai package in threads.

    Not a test: run it by hand against a sim (``python -m llmgw.sim --port 0``)
    to see why the load above is not the openai package.
    """
    import concurrent.futures
    import urllib.parse

    import openai

    parsed = urllib.parse.urlsplit(url)
    load = Load(parsed.port, model, clients, parsed.hostname)

    async def raw() -> None:
        await asyncio.gather(*(_one(load.host, load.port, load.body) for _ in range(requests)))

    before = time.process_time()
    asyncio.run(raw())
    raw_s = (time.process_time() - before) / requests

    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)

    def one(_):
        stream = client.chat.completions.create(model=model, stream=True,
                                                messages=[{"role": "user", "content": "tell me a story"}])
        return sum(1 for _ in stream)

    before = time.process_time()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        list(pool.map(one, range(requests)))
    openai_s = (time.process_time() - before) / requests
    return {"raw_asyncio_cpu_ms_per_request": raw_s * 1000, "openai_threads_cpu_ms_per_request": openai_s * 1000}
