"""llmgw's router against its peers: one sim engine, reached directly, through llmgw and through each peer.

    bench/setup-peers.sh        # once: LiteLLM and vllm-router, each in a virtualenv under bench/.peers/
    .venv/bin/python bench/router.py [--seconds 8] [--warmup 1] [--targets direct,llmgw,litellm,vllm-router]
                                     [--pin] [--slow-streams 1000] [--slow-seconds 30] [--slow-tokens-per-s 5]

Starts ``python -m llmgw.sim --quiet --ttft-ms 0 --output-tokens 32`` and
measures the same load against it directly, through llmgw's router (one
``twistd llmgw-router`` process with a static endpoint list) and through
each peer that ``bench/setup-peers.sh`` installed under ``bench/.peers/``:
LiteLLM's proxy (one worker, the sim as an OpenAI-compatible backend) and
the Rust ``vllm-router`` (the sim as its only worker).  A peer that is not
installed is skipped, and said to be.

Every process is started on 127.0.0.1 and counted as ready when a chat
completion through it succeeds; every process is stopped at the end, also
on Ctrl-C, SIGTERM or an error.  All targets are started first and measured
one after the other within each cell, so that load from elsewhere on the
machine falls on all of them alike (an idle peer takes no measurable CPU:
LiteLLM 0.2%).

The load: concurrency 1 and 32, non-streaming and streaming (32 tokens, one
SSE chunk each), over keep-alive HTTP/1.1 connections from the asyncio client
below, a warm-up then a measured window per cell.  Each cell gives requests/s,
p50/p99 latency, p50 time to the first body chunk (streaming) and the router
process tree's CPU milliseconds per request (psutil, user + system).  Then
the memory cell: ``--slow-streams`` streams from a second sim pacing
``--slow-tokens-per-s`` tokens a second, read slowly (128 bytes a second
each), through llmgw and vllm-router; the router's RSS before, after opening
and over ``--slow-seconds``, and how many tokens the sim generated meanwhile
(at 5 tokens/s the kernel's socket buffers hold all 30 s of a stream, so the
sim is never held back; at 50 they fill, and a router with backpressure holds
the sim back to what the client reads).

Prints a table, one JSON line per cell, and the targets of issue 4 with
PASS/FAIL and the measured figure.  Not a test: the exit status is 0 when it
ran, whatever the verdicts; 1 when something could not be started.

``--pin`` (two CPUs or more): the router under test gets the last CPU, the
client and the sim the others, so the router's CPU is never taken by them.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import resource
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import attr
import psutil

ROOT = Path(__file__).resolve().parents[1]
PEERS = ROOT / "bench" / ".peers"
MODEL = "echo"
SLOW_MODEL = "slow"
TOKENS = 32
SLOW_READ_BYTES = 128  # per stream per second: well under the ~1.2 KB/s the slow sim sends
CONCURRENCIES = (1, 32)
TARGET_NAMES = ("direct", "llmgw", "litellm", "vllm-router")


class StartError(Exception):
    """A process the benchmark needs did not start; its log is named in the message."""


# Processes ----------------------------------------------------------------------------


@attr.s(auto_attribs=True)
class Child:
    name: str
    popen: subprocess.Popen
    log: Path

    def tail(self, lines: int = 15) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join("    " + line for line in text[-lines:])

    def cpu_seconds(self) -> float:
        """User + system CPU of the process and everything below it."""
        total = 0.0
        try:
            top = psutil.Process(self.popen.pid)
            procs = [top, *top.children(recursive=True)]
        except psutil.NoSuchProcess:
            return total
        for p in procs:
            try:
                t = p.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += t.user + t.system
        return total

    def rss(self) -> int:
        total = 0
        try:
            top = psutil.Process(self.popen.pid)
            for p in (top, *top.children(recursive=True)):
                total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
        return total


class Children:
    """Every process the benchmark starts, each in a session of its own so its whole group can be stopped."""

    def __init__(self, logdir: Path, client_cpus: set[int] | None, router_cpus: set[int] | None) -> None:
        self.logdir = logdir
        self.client_cpus = client_cpus
        self.router_cpus = router_cpus
        self.running: list[Child] = []

    def start(self, name: str, argv: list[str], env: dict[str, str], router: bool = False) -> Child:
        cpus = self.router_cpus if router else self.client_cpus
        log = self.logdir / f"{name}.log"
        with open(log, "wb") as out:
            popen = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                cwd=self.logdir, start_new_session=True,
                preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
            )
        child = Child(name, popen, log)
        self.running.append(child)
        return child

    def stop(self, child: Child) -> None:
        if child in self.running:
            self.running.remove(child)
        for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            try:
                os.killpg(child.popen.pid, sig)
            except ProcessLookupError:
                pass
            try:
                child.popen.wait(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue
        # What the leader left behind in its group (a worker process) goes too.
        try:
            os.killpg(child.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def stop_all(self) -> None:
        for child in reversed(list(self.running)):
            self.stop(child)


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "https_proxy", "all_proxy", "pythonpath")}
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_sim(children: Children, name: str, model: str, *flags: str) -> tuple[Child, int]:
    env = clean_env(PYTHONPATH=str(ROOT / "src"))
    child = children.start(name, [sys.executable, "-m", "llmgw.sim", "--host", "127.0.0.1", "--port", "0",
                                  "--model", model, "--quiet", "--ttft-ms", "0", *flags], env)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for line in child.log.read_text(errors="replace").splitlines():
            if line.startswith("sim: serving"):
                return child, int(line.rsplit(":", 1)[1])
        if child.popen.poll() is not None:
            break
        time.sleep(0.05)
    raise StartError(f"{name} did not say it was serving (log {child.log}):\n{child.tail()}")


def wait_ready(child: Child, port: int, model: str, key: str, timeout: float) -> float:
    """Until a chat completion through ``port`` gets 200; seconds it took."""
    body = json.dumps({"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "ready?"}]})
    t0 = time.monotonic()
    last = "no answer"
    while time.monotonic() - t0 < timeout:
        if child.popen.poll() is not None:
            raise StartError(f"{child.name} exited with status {child.popen.returncode} before serving "
                             f"(log {child.log}):\n{child.tail()}")
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            conn.request("POST", "/v1/chat/completions", body,
                         {"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
            response = conn.getresponse()
            text = response.read()
            if response.status == 200:
                return time.monotonic() - t0
            last = f"{response.status} {text[:200]!r}"
        except OSError as e:
            last = str(e)
        finally:
            conn.close()
        time.sleep(0.1)
    raise StartError(f"{child.name} did not answer a chat completion within {timeout:g} s (last: {last}; "
                     f"log {child.log}):\n{child.tail()}")


def start_llmgw(children: Children, sims: dict[str, int], key: str) -> tuple[Child, int]:
    port = free_port()
    endpoints = ", ".join(f'{{model: {m}, url: "http://127.0.0.1:{p}"}}' for m, p in sims.items())
    config = children.logdir / "router.yaml"
    # In flight per endpoint above the slow-stream count: the memory cell holds them all open at once.
    config.write_text(
        f'listen: {{api: "tcp:{port}:interface=127.0.0.1:backlog=1024", admin: null}}\n'
        "router:\n"
        "  admission: {max_inflight_per_endpoint: 2048, queue: 1024, queue_timeout_s: 30}\n"
        f"  endpoints: [{endpoints}]\n"
    )
    env = clean_env(PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
    argv = [sys.executable, "-c", "from twisted.scripts.twistd import run; run()", "--nodaemon", "--pidfile=",
            "--logfile=-", "llmgw-router", "--config", str(config)]
    child = children.start("llmgw", argv, env, router=True)
    for model in sims:
        wait_ready(child, port, model, key, 60)
    return child, port


def start_litellm(children: Children, sims: dict[str, int], key: str) -> tuple[Child, int]:
    port = free_port()
    config = children.logdir / "litellm.yaml"
    lines = ["model_list:"]
    for model, sim_port in sims.items():
        lines += [f"  - model_name: {model}",
                  f'    litellm_params: {{model: "openai/{model}", api_base: "http://127.0.0.1:{sim_port}/v1", api_key: x}}']
    lines.append(f'general_settings: {{master_key: "{key}"}}')
    config.write_text("\n".join(lines) + "\n")
    env = clean_env(LITELLM_LOCAL_MODEL_COST_MAP="True")
    argv = [str(PEERS / "litellm" / "bin" / "litellm"), "--config", str(config), "--host", "127.0.0.1",
            "--port", str(port), "--num_workers", "1"]
    child = children.start("litellm", argv, env, router=True)
    for model in sims:
        wait_ready(child, port, model, key, 180)
    return child, port


def start_vllm_router(children: Children, name: str, sim_port: int, model: str, key: str) -> tuple[Child, int]:
    # It sends every request to its workers whatever the model, so one instance per sim.
    port = free_port()
    argv = [str(PEERS / "vllm-router" / "bin" / "vllm-router"), "--host", "127.0.0.1", "--port", str(port),
            "--worker-urls", f"http://127.0.0.1:{sim_port}", "--policy", "round_robin",
            "--worker-startup-check-interval", "1", "--prometheus-host", "127.0.0.1",
            "--prometheus-port", str(free_port()), "--log-level", "warning"]
    child = children.start(name, argv, clean_env(), router=True)
    wait_ready(child, port, model, key, 60)
    return child, port


def peer_installed(name: str) -> bool:
    return (PEERS / name / "bin" / name).exists()


# The client ---------------------------------------------------------------------------

HEAD, BODY, CHUNK_SIZE, CHUNK_DATA, TRAILER = range(5)


class Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection, one request at a time: status, Content-Length or chunked."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.pos = 0
        self.state = HEAD
        self.remaining = 0
        self.status = 0
        self.closing = False
        self.closed = False
        self.first: float | None = None
        self.done: asyncio.Future | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self.done is not None and not self.done.done():
            self.done.set_exception(ConnectionError("the server closed the connection mid-response"))

    async def exchange(self, request: bytes) -> tuple[int, float]:
        """Send ``request``; (status, perf_counter time of the first body byte)."""
        self.done = asyncio.get_running_loop().create_future()
        self.first = None
        self.transport.write(request)
        return await self.done

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        buf = self.buf
        buf += data
        while True:
            if self.state == HEAD:
                end = buf.find(b"\r\n\r\n", self.pos)
                if end < 0:
                    return
                head = bytes(buf[self.pos : end]).lower()
                self.pos = end + 4
                self.status = int(head[9:12])
                self.closing = b"\r\nconnection: close" in head
                if b"\r\ntransfer-encoding: chunked" in head:
                    self.state = CHUNK_SIZE
                else:
                    i = head.find(b"\r\ncontent-length:")
                    if i < 0:
                        self._fail(f"a response with neither Content-Length nor chunked: {head[:80]!r}")
                        return
                    j = head.find(b"\r\n", i + 2)
                    self.remaining = int(head[i + 17 : j if j > 0 else None])
                    self.state = BODY
                    if self.remaining == 0:
                        self._finish()
                        continue
            elif self.state == BODY:
                available = len(buf) - self.pos
                if available <= 0:
                    return
                if self.first is None:
                    self.first = now
                take = min(available, self.remaining)
                self.pos += take
                self.remaining -= take
                if self.remaining:
                    return
                self._finish()
            elif self.state == CHUNK_SIZE:
                end = buf.find(b"\r\n", self.pos)
                if end < 0:
                    return
                size = int(bytes(buf[self.pos : end]).split(b";")[0], 16)
                self.pos = end + 2
                if size == 0:
                    self.state = TRAILER
                else:
                    self.remaining = size + 2  # the data and its CRLF
                    self.state = CHUNK_DATA
            elif self.state == CHUNK_DATA:
                available = len(buf) - self.pos
                if available <= 0:
                    return
                if self.first is None:
                    self.first = now
                take = min(available, self.remaining)
                self.pos += take
                self.remaining -= take
                if self.remaining:
                    return
                self.state = CHUNK_SIZE
            else:  # TRAILER: header lines, then an empty one
                end = buf.find(b"\r\n", self.pos)
                if end < 0:
                    return
                empty = end == self.pos
                self.pos = end + 2
                if empty:
                    self._finish()

    def _finish(self) -> None:
        del self.buf[: self.pos]
        self.pos = 0
        self.state = HEAD
        if self.done is not None and not self.done.done():
            self.done.set_result((self.status, self.first if self.first is not None else time.perf_counter()))

    def _fail(self, why: str) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_exception(RuntimeError(why))
        self.transport.close()


def request_bytes(model: str, stream: bool, key: str) -> bytes:
    body = {"model": model, "messages": [{"role": "user", "content": "Say something about the weather in Lisbon today."}]}
    if stream:
        body["stream"] = True
    data = json.dumps(body).encode()
    # The headers the openai Python client sends, so each router parses what it would in production.
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept-Encoding: gzip, deflate\r\n"
        b"Connection: keep-alive\r\nAccept: application/json\r\nContent-Type: application/json\r\n"
        b"User-Agent: OpenAI/Python 1.99.0\r\nX-Stainless-Lang: python\r\nX-Stainless-Package-Version: 1.99.0\r\n"
        b"X-Stainless-OS: Linux\r\nX-Stainless-Arch: x64\r\nX-Stainless-Runtime: CPython\r\n"
        b"X-Stainless-Runtime-Version: 3.11.7\r\nAuthorization: Bearer %b\r\nX-Stainless-Async: false\r\n"
        b"x-stainless-retry-count: 0\r\nx-stainless-read-timeout: 600\r\nContent-Length: %d\r\n\r\n%b"
        % (key.encode(), len(data), data)
    )


@attr.s(auto_attribs=True)
class Tally:
    latencies: list[float] = attr.Factory(list)
    firsts: list[float] = attr.Factory(list)
    errors: int = 0
    first_error: str | None = None

    def error(self, why: str) -> None:
        self.errors += 1
        self.first_error = self.first_error or why


async def drive(port: int, request: bytes, concurrency: int, warmup: float, seconds: float,
                between=lambda: None) -> tuple[Tally, float]:
    """``concurrency`` connections, each sending ``request`` back to back: ``warmup`` s unrecorded, then ``seconds``."""
    loop = asyncio.get_running_loop()

    async def connect() -> Connection:
        _, conn = await loop.create_connection(Connection, "127.0.0.1", port)
        return conn

    conns = [await connect() for _ in range(concurrency)]

    async def worker(i: int, deadline: float, tally: Tally) -> None:
        clock = time.perf_counter
        while True:
            conn = conns[i]
            if conn.closed or conn.closing:
                conn.transport.close()
                conn = conns[i] = await connect()
            t0 = clock()
            if t0 >= deadline:
                return
            try:
                status, first = await conn.exchange(request)
            except (ConnectionError, RuntimeError) as e:
                tally.error(str(e))
                conn.closed = True
                continue
            if status != 200:
                tally.error(f"HTTP {status}")
                continue
            tally.latencies.append(clock() - t0)
            tally.firsts.append(first - t0)

    warm = Tally()
    end = time.perf_counter() + warmup
    await asyncio.gather(*(worker(i, end, warm) for i in range(concurrency)))
    between()
    tally = Tally()
    start = time.perf_counter()
    await asyncio.gather(*(worker(i, start + seconds, tally) for i in range(concurrency)))
    elapsed = time.perf_counter() - start
    for conn in conns:
        conn.transport.close()
    return tally, elapsed


def percentile(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def ms(seconds: float | None, digits: int = 3) -> float | None:
    return None if seconds is None else round(seconds * 1000, digits)


def measure(target: str, port: int, router: Child | None, sim: Child, concurrency: int, stream: bool,
            key: str, warmup: float, seconds: float) -> dict:
    marks = {}

    def mark() -> None:
        marks["router"] = router.cpu_seconds() if router else None
        marks["sim"] = sim.cpu_seconds()

    tally, elapsed = asyncio.run(drive(port, request_bytes(MODEL, stream, key), concurrency, warmup, seconds, mark))
    n = len(tally.latencies)
    router_cpu = (router.cpu_seconds() - marks["router"]) if router else None
    sim_cpu = sim.cpu_seconds() - marks["sim"]
    return {
        "target": target, "mode": "streaming" if stream else "non-streaming", "concurrency": concurrency,
        "requests": n, "errors": tally.errors, "first_error": tally.first_error,
        "rps": round(n / elapsed, 1),
        "p50_ms": ms(percentile(tally.latencies, 50)), "p99_ms": ms(percentile(tally.latencies, 99)),
        "ttft_p50_ms": ms(percentile(tally.firsts, 50)) if stream else None,
        "router_cpu_ms_per_req": round(router_cpu * 1000 / n, 4) if router and n else None,
        "sim_cpu_ms_per_req": round(sim_cpu * 1000 / n, 4) if n else None,
        "load1": round(os.getloadavg()[0], 2),
    }


# The memory cell -----------------------------------------------------------------------


def sim_generated(sim_port: int) -> int:
    """The tokens a sim has generated so far, from its ``/metrics``."""
    conn = http.client.HTTPConnection("127.0.0.1", sim_port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
               if line.startswith("vllm:generation_tokens_total"))


async def slow_streams(port: int, router: Child, sim_port: int, pace: float, key: str, count: int, seconds: float,
                       log) -> dict:
    """``count`` streams from the slow sim, each read at SLOW_READ_BYTES a second: the router's RSS over time.

    Also what the sim generated meanwhile: once the socket buffers between it and the client are
    full, a router that holds the engine back when its client does not read makes that well under
    ``pace`` tokens for every second of every stream.
    """
    loop = asyncio.get_running_loop()
    generated_before = sim_generated(sim_port)
    request = request_bytes(SLOW_MODEL, True, key)
    mib = lambda b: round(b / 2**20, 1)  # noqa: E731
    rss_start = router.rss()
    cpu_start = router.cpu_seconds()
    gate = asyncio.Semaphore(64)  # a listen backlog's worth of connects at a time
    socks: list[socket.socket] = []
    failures: list[str] = []

    async def open_one() -> None:
        async with gate:
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.setblocking(False)
            try:
                await loop.sock_connect(s, ("127.0.0.1", port))
                await loop.sock_sendall(s, request)
                head = await asyncio.wait_for(loop.sock_recv(s, 512), 30)
            except (OSError, asyncio.TimeoutError) as e:
                failures.append(str(e) or type(e).__name__)
                s.close()
                return
            if not head.startswith(b"HTTP/1.1 200"):
                failures.append(head.split(b"\r\n")[0].decode(errors="replace") or "closed")
                s.close()
                return
            socks.append(s)

    t_open = time.monotonic()
    await asyncio.gather(*(open_one() for _ in range(count)))
    open_s = time.monotonic() - t_open
    rss_open = router.rss()
    log(f"  {len(socks)} of {count} streams open in {open_s:.1f} s; router RSS {mib(rss_start)} -> {mib(rss_open)} MiB")
    samples: list[tuple[float, int]] = []
    read = 0
    ended = 0
    t0 = time.monotonic()
    for tick in range(1, int(seconds) + 1):
        await asyncio.sleep(t0 + tick - time.monotonic())
        for s in socks:
            if s.fileno() < 0:
                continue
            try:
                data = s.recv(SLOW_READ_BYTES)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                ended += 1
                s.close()
            read += len(data)
        samples.append((tick, router.rss()))
        if tick % 5 == 0:
            log(f"  {tick:3d} s: router RSS {mib(samples[-1][1])} MiB, {len(socks) - ended} streams open")
    cpu = router.cpu_seconds() - cpu_start
    generated = sim_generated(sim_port) - generated_before
    for s in socks:
        s.close()
    at = dict(samples)
    last = samples[-1][1]
    ten_before = at.get(samples[-1][0] - 10, samples[0][1])
    return {
        "streams": count, "opened": len(socks), "open_failures": len(failures),
        "first_failure": failures[0] if failures else None, "ended_early": ended, "seconds": seconds,
        "rss_start_mib": mib(rss_start), "rss_open_mib": mib(rss_open),
        "rss_20s_mib": mib(at[20]) if 20 in at else None, "rss_end_mib": mib(last),
        "rss_growth_last_10s_mib": mib(last - ten_before),
        "rss_per_stream_kib": round((rss_open - rss_start) / max(1, len(socks)) / 1024, 1),
        "client_read_bytes_per_stream_per_s": round(read / max(1, len(socks)) / seconds),
        "sim_tokens_per_stream": round(generated / max(1, len(socks)), 1),
        "sim_tokens_per_stream_unthrottled": round((time.monotonic() - t_open) * pace),
        "sim_tokens_per_s": pace,
        "router_cpu_percent": round(cpu / (time.monotonic() - t_open) * 100),
        "load1": round(os.getloadavg()[0], 2),
    }


# Report ---------------------------------------------------------------------------------


def fmt(value, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def print_table(rows: list[dict]) -> None:
    print(f"{'target':<12}{'mode':<14}{'conc':>5}{'requests':>9}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}"
          f"{'TTFT p50':>10}{'CPU ms/req':>11}{'errors':>7}{'load':>6}")
    for r in rows:
        print(f"{r['target']:<12}{r['mode']:<14}{r['concurrency']:>5}{r['requests']:>9}{fmt(r['rps'], ',.0f'):>9}"
              f"{fmt(r['p50_ms']):>9}{fmt(r['p99_ms']):>9}{fmt(r['ttft_p50_ms']):>10}"
              f"{fmt(r['router_cpu_ms_per_req']):>11}{r['errors']:>7}{r['load1']:>6.1f}")


def verdicts(rows: list[dict], memory: dict[str, dict]) -> list[tuple[str, str, str]]:
    """(target, PASS/FAIL/SKIP, measured figure) for each of issue 4's targets."""
    cell = {(r["target"], r["mode"], r["concurrency"]): r for r in rows}
    out: list[tuple[str, str, str]] = []

    def check(name: str, ok: bool | None, figure: str) -> None:
        out.append((name, "SKIP" if ok is None else "PASS" if ok else "FAIL", figure))

    def pair(mode: str, conc: int, a: str, b: str):
        return cell.get((a, mode, conc)), cell.get((b, mode, conc))

    for mode in ("non-streaming", "streaming"):
        lg, d = pair(mode, 1, "llmgw", "direct")
        for p, limit in (("p50", 0.5), ("p99", 1.5)):
            name = f"added {p} latency over direct, {mode}, concurrency 1 <= {limit} ms"
            if lg and d and lg[f"{p}_ms"] is not None and d[f"{p}_ms"] is not None:
                added = lg[f"{p}_ms"] - d[f"{p}_ms"]
                check(name, added <= limit, f"{added:+.3f} ms ({lg[f'{p}_ms']:.3f} vs {d[f'{p}_ms']:.3f})")
            else:
                check(name, None, "not measured")
    lg, d = pair("streaming", 1, "llmgw", "direct")
    name = "streaming TTFT p50 within 1 ms of direct, concurrency 1"
    if lg and d and lg["ttft_p50_ms"] is not None and d["ttft_p50_ms"] is not None:
        added = lg["ttft_p50_ms"] - d["ttft_p50_ms"]
        check(name, added <= 1.0, f"{added:+.3f} ms ({lg['ttft_p50_ms']:.3f} vs {d['ttft_p50_ms']:.3f})")
    else:
        check(name, None, "not measured")
    for conc in CONCURRENCIES:
        lg = cell.get(("llmgw", "non-streaming", conc))
        name = f"router CPU per request, non-streaming, concurrency {conc} <= 0.25 ms"
        value = lg and lg["router_cpu_ms_per_req"]
        check(name, None if value is None else value <= 0.25, "not measured" if value is None else f"{value:.3f} ms")
    for mode in ("non-streaming", "streaming"):
        for peer, factor in (("litellm", 20), ("vllm-router", 0.35)):
            lg, p = pair(mode, 32, "llmgw", peer)
            name = f"throughput at concurrency 32, {mode}, >= {factor:g}x {peer}"
            if lg and p and p["rps"]:
                ratio = lg["rps"] / p["rps"]
                check(name, ratio >= factor, f"{ratio:.2f}x ({lg['rps']:,.0f} vs {p['rps']:,.0f} req/s)")
            else:
                check(name, None, f"{peer} not measured")
    m = memory.get("llmgw")
    name = "memory flat under slow-reading streams (growth over the last 10 s < 2 MiB)"
    if m and m["opened"]:
        flat = m["rss_growth_last_10s_mib"] < 2 and m["opened"] == m["streams"]
        check(name, flat, f"{m['opened']} streams: RSS {m['rss_start_mib']} MiB at start, {m['rss_open_mib']} "
                          f"after opening, {fmt(m['rss_20s_mib'], '.1f')} at 20 s, {m['rss_end_mib']} at {m['seconds']:g} s "
                          f"({m['rss_growth_last_10s_mib']:+.1f} over the last 10 s)")
    else:
        check(name, None, "not measured")
    return out


# Main ------------------------------------------------------------------------------------


def raise_fd_limit(need: int) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max(soft, min(hard if hard != resource.RLIM_INFINITY else 65536, 65536))
    if want < need:
        raise StartError(f"the open-file limit is {hard} at most; the slow-stream cell needs {need} (raise `ulimit -Hn`)")
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return want


def machine() -> str:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} CPUs ({model}), Python {sys.version.split()[0]}, load average {os.getloadavg()[0]:.2f}"


def revision() -> str:
    """The commit measured, and whether the router's source differs from it."""
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "src/llmgw/router"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "not a git checkout"
    return f"commit {head}" + (" with uncommitted changes to src/llmgw/router" if dirty else "")


def run(args, children: Children, log) -> int:
    key = "sk-bench-" + secrets.token_hex(24)  # LiteLLM refuses to start without a strong master key
    targets = [t for t in args.targets.split(",") if t]
    for t in targets:
        if t not in TARGET_NAMES:
            raise SystemExit(f"--targets: unknown target {t!r}; known: {', '.join(TARGET_NAMES)}")
    for peer in ("litellm", "vllm-router"):
        if peer in targets and not peer_installed(peer):
            log(f"{peer}: not installed under {PEERS / peer}, skipped (bench/setup-peers.sh installs it)")
            targets.remove(peer)
    sim, sim_port = start_sim(children, "sim", MODEL, "--output-tokens", str(TOKENS))
    slow_port = None
    if args.slow_streams:
        # Enough tokens that no stream ends inside the window.
        pace = args.slow_tokens_per_s
        _, slow_port = start_sim(children, "sim-slow", SLOW_MODEL, "--tokens-per-s", f"{pace:g}",
                                 "--output-tokens", str(int(args.slow_seconds * pace * 4 + 100)))
    sims = {MODEL: sim_port, **({SLOW_MODEL: slow_port} if slow_port else {})}
    servers: dict[str, tuple[Child | None, int]] = {}
    for target in targets:
        t0 = time.monotonic()
        if target == "direct":
            servers[target] = (None, sim_port)
            continue
        if target == "llmgw":
            servers[target] = start_llmgw(children, sims, key)
        elif target == "litellm":
            servers[target] = start_litellm(children, sims if "litellm" in args.memory_targets else {MODEL: sim_port}, key)
        else:
            servers[target] = start_vllm_router(children, "vllm-router", sim_port, MODEL, key)
        router, port = servers[target]
        log(f"{target}: ready in {time.monotonic() - t0:.1f} s (pid {router.popen.pid}, port {port})")
    rows: list[dict] = []
    # Target after target within each cell, so that load from elsewhere on the machine falls on all alike.
    for concurrency in CONCURRENCIES:
        for stream in (False, True):
            for target, (router, port) in servers.items():
                row = measure(target, port, router, sim, concurrency, stream, key, args.warmup, args.seconds)
                rows.append(row)
                log(f"  {target} {row['mode']} c={concurrency}: {row['rps']:,.0f} req/s, p50 {fmt(row['p50_ms'])} ms, "
                    f"p99 {fmt(row['p99_ms'])} ms, CPU {fmt(row['router_cpu_ms_per_req'])} ms/req, "
                    f"{row['errors']} errors, load {row['load1']}")
    memory: dict[str, dict] = {}
    for target, (router, port) in servers.items():
        if target in args.memory_targets and slow_port and router:
            if target == "vllm-router":
                router, port = start_vllm_router(children, "vllm-router-slow", slow_port, SLOW_MODEL, key)
            log(f"  {target}: {args.slow_streams} slow-reading streams for {args.slow_seconds:g} s")
            memory[target] = asyncio.run(slow_streams(port, router, slow_port, args.slow_tokens_per_s, key,
                                                      args.slow_streams, args.slow_seconds, log))
            if target == "vllm-router":
                children.stop(router)

    print()
    print(f"router benchmark: {machine()}; {revision()}; {args.warmup:g} s warm-up + {args.seconds:g} s per cell, "
          f"{TOKENS} tokens per response, {'router pinned to its own CPU' if args.pin else 'not pinned'}")
    print()
    print_table(rows)
    if memory:
        print()
        print(f"{'memory':<12}{'streams':>8}{'opened':>8}{'RSS start':>11}{'opened':>9}{'at 20 s':>9}{'at end':>9}"
              f"{'last 10 s':>11}{'KiB/stream':>11}{'CPU %':>7}{'sim tokens/stream':>19}")
        for target, m in memory.items():
            print(f"{target:<12}{m['streams']:>8}{m['opened']:>8}{m['rss_start_mib']:>11.1f}{m['rss_open_mib']:>9.1f}"
                  f"{fmt(m['rss_20s_mib'], '.1f'):>9}{m['rss_end_mib']:>9.1f}{m['rss_growth_last_10s_mib']:>+11.1f}"
                  f"{m['rss_per_stream_kib']:>11.1f}{m['router_cpu_percent']:>7}"
                  f"{m['sim_tokens_per_stream']:>10.1f} of {m['sim_tokens_per_stream_unthrottled']:<5}")
    print()
    for row in rows:
        print(json.dumps(row))
    for target, m in memory.items():
        print(json.dumps({"target": target, "mode": "slow-streams", **m}))
    print()
    for name, verdict, figure in verdicts(rows, memory):
        print(f"{verdict:<5} {name}: {figure}")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=8.0, help="measured seconds per cell (default 8)")
    p.add_argument("--warmup", type=float, default=1.0, help="unrecorded seconds before each cell (default 1)")
    p.add_argument("--targets", default=",".join(TARGET_NAMES), help="comma-separated, from: " + ", ".join(TARGET_NAMES))
    p.add_argument("--slow-streams", type=int, default=1000, help="streams in the memory cell; 0 skips it (default 1000)")
    p.add_argument("--slow-seconds", type=float, default=30.0, help="length of the memory cell (default 30)")
    p.add_argument("--slow-tokens-per-s", type=float, default=5.0,
                   help="pace of the slow sim (default 5; at 50 the socket buffers fill and backpressure shows)")
    p.add_argument("--memory-targets", default="llmgw,vllm-router",
                   help="routers given the memory cell (default llmgw,vllm-router; LiteLLM is slow to open 1,000 streams)")
    p.add_argument("--pin", action="store_true", help="the router on the last CPU, the client and the sims on the others")
    p.add_argument("--keep-logs", action="store_true", help="keep the processes' logs (their directory is printed)")
    args = p.parse_args()
    args.memory_targets = args.memory_targets.split(",")

    logdir = Path(tempfile.mkdtemp(prefix="llmgw-bench-router-"))
    cpus = sorted(os.sched_getaffinity(0))
    client_cpus = router_cpus = None
    if args.pin and len(cpus) >= 2:
        router_cpus, client_cpus = {cpus[-1]}, set(cpus[:-1])
        os.sched_setaffinity(0, client_cpus)
    children = Children(logdir, client_cpus, router_cpus)

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    def terminated(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, terminated)
    signal.signal(signal.SIGHUP, terminated)
    failed = True
    try:
        limit = raise_fd_limit(4096 if args.slow_streams < 1000 else 4 * args.slow_streams + 512)
        log(f"open-file limit {limit}; logs in {logdir}; {machine()}")
        status = run(args, children, log)
        failed = False
        return status
    except StartError as e:
        log(f"router benchmark: {e}")
        return 1
    except KeyboardInterrupt:
        log("router benchmark: interrupted; stopping what it started")
        return 130
    finally:
        children.stop_all()
        if failed or args.keep_logs:
            log(f"logs kept in {logdir}")
        else:
            shutil.rmtree(logdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
