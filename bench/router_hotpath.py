"""What the router's request path costs: one sim engine, direct and through llmgw's router.

    .venv/bin/python bench/router_hotpath.py [--seconds 5] [--concurrency 1,32] [--tokens 32] [--pin]

Starts ``python -m llmgw.sim --quiet --ttft-ms 0`` and, in a process of its
own, the router (``RouterFactory`` on the epoll reactor, with the tests' static
dispatcher: admission is immediate, so what is measured is the request path).
Then, for each concurrency, non-streaming and streaming (``--tokens`` chunks,
``include_usage`` on) chat completions go over keep-alive connections for
``--seconds`` each, first to the engine directly, then through the router.
Prints a table and one JSON line per cell: requests/s, p50/p99 latency, p50
time to first byte of the body, and the router process's CPU milliseconds per
request (user + system, from psutil).  Not a test: it asserts nothing.

With ``--pin`` (two CPUs or more) the router gets one CPU and the client and the
engine share the other, so the router's CPU is never stolen by them; without
it the scheduler decides.  The router process calls ``gc.freeze()`` once it
listens, as the sim does; ``--no-freeze`` measures it without.
``--slow-streams N`` instead opens N streams that are never read and prints
the router's memory once a second.  ``--serve-router PORT`` is how the router
process is started; ``--profile FILE`` (with it) writes a cProfile of it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = "bench"


# The router process ---------------------------------------------------------------


def serve_router(upstream_port: int, profile: str | None, freeze: bool) -> int:
    from twisted.internet import epollreactor

    epollreactor.install()
    from twisted.internet import reactor

    sys.path.insert(0, str(ROOT / "src"))
    sys.path.insert(0, str(ROOT))
    from tests.router.routerharness import StaticDispatcher, StaticEndpoint

    from llmgw.router.server import RouterFactory

    dispatcher = StaticDispatcher([StaticEndpoint("sim", "127.0.0.1", upstream_port)], models=(MODEL,))
    factory = RouterFactory(dispatcher, reactor, max_body_bytes=16 << 20)
    port = reactor.listenTCP(0, factory, interface="127.0.0.1", backlog=1024)
    print(f"router: serving on http://127.0.0.1:{port.getHost().port}", flush=True)
    import gc
    import signal

    if freeze:
        # As the sim does: what exists at start lives as long as the process,
        # so keep the collector from walking it again and again.
        gc.freeze()
    signal.signal(signal.SIGTERM, lambda *_: reactor.callFromThread(reactor.stop))
    if profile:
        import cProfile

        cProfile.runctx("reactor.run()", globals(), {"reactor": reactor}, profile)
    else:
        reactor.run()
    return 0


# The client ---------------------------------------------------------------------


class Connection(asyncio.Protocol):
    """One keep-alive connection, one request at a time: latency, and time to the first body byte."""

    def __init__(self) -> None:
        self.transport = None
        self.buf = bytearray()
        self.done: asyncio.Future | None = None
        self.first: float | None = None
        self.head_end = -1

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_exception(ConnectionError("the server closed the connection"))

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        if self.head_end < 0:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            self.head_end = end + 4
        if self.first is None and len(buf) > self.head_end:
            self.first = time.perf_counter()
        head = bytes(buf[: self.head_end]).lower()
        i = head.find(b"content-length: ")
        if i >= 0:
            length = int(head[i + 16 : head.find(b"\r\n", i)])
            if len(buf) >= self.head_end + length:
                self._finish(head, self.head_end + length)
        elif buf.endswith(b"\r\n0\r\n\r\n"):
            self._finish(head, len(buf))

    def _finish(self, head: bytes, size: int) -> None:
        if not head.startswith(b"http/1.1 200"):
            self.done.set_exception(RuntimeError(head.split(b"\r\n")[0].decode()))
        else:
            self.done.set_result(None)
        del self.buf[:size]
        self.head_end = -1

    async def exchange(self, request: bytes) -> float:
        self.done = asyncio.get_running_loop().create_future()
        self.first = None
        t0 = time.perf_counter()
        self.transport.write(request)
        await self.done
        return (self.first or time.perf_counter()) - t0


def request_bytes(stream: bool) -> bytes:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Say something about the weather in Lisbon today."}]}
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    data = json.dumps(body).encode()
    # The fields the openai Python client sends, so the router parses what it would in production.
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept-Encoding: gzip, deflate\r\n"
        b"Connection: keep-alive\r\nAccept: application/json\r\nContent-Type: application/json\r\n"
        b"User-Agent: OpenAI/Python 1.99.0\r\nX-Stainless-Lang: python\r\nX-Stainless-Package-Version: 1.99.0\r\n"
        b"X-Stainless-OS: Linux\r\nX-Stainless-Arch: x64\r\nX-Stainless-Runtime: CPython\r\n"
        b"X-Stainless-Runtime-Version: 3.11.7\r\nAuthorization: Bearer sk-bench\r\nX-Stainless-Async: false\r\n"
        b"x-stainless-retry-count: 0\r\nx-stainless-read-timeout: 600\r\nContent-Length: %d\r\n\r\n%b" % (len(data), data)
    )


async def cell(port: int, concurrency: int, stream: bool, seconds: float):
    loop = asyncio.get_running_loop()
    request = request_bytes(stream)
    conns = []
    for _ in range(concurrency):
        _, conn = await loop.create_connection(Connection, "127.0.0.1", port)
        conns.append(conn)
    for _ in range(20):
        await asyncio.gather(*(c.exchange(request) for c in conns))
    latencies: list[float] = []
    ttfbs: list[float] = []
    start = time.perf_counter()
    deadline = start + seconds

    async def worker(conn: Connection) -> None:
        clock = time.perf_counter
        while True:
            t0 = clock()
            if t0 >= deadline:
                return
            ttfbs.append(await conn.exchange(request))
            latencies.append(clock() - t0)

    await asyncio.gather(*(worker(c) for c in conns))
    elapsed = time.perf_counter() - start
    for c in conns:
        c.transport.close()
    return latencies, ttfbs, elapsed


def slow_streams(router_pid: int, port: int, count: int, seconds: float) -> dict:
    """``count`` streams whose clients never read: the router's memory, sampled once a second."""
    import socket

    import psutil

    proc = psutil.Process(router_pid)
    body = json.dumps({"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "a slow reader"}]}).encode()
    request = b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b" % (
        len(body), body)
    before = proc.memory_info().rss
    clients = []
    for _ in range(count):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", port))
        s.sendall(request)
        clients.append(s)
    samples = []
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        time.sleep(1)
        samples.append(round((proc.memory_info().rss - before) / 2**20, 1))
        print(f"  {time.monotonic() - t0:4.0f} s: router RSS +{samples[-1]} MiB over idle, "
              f"CPU {proc.cpu_percent():.0f}%", flush=True)
    for s in clients:
        s.close()
    half = samples[len(samples) // 2]
    return {"slow_streams": count, "seconds": seconds, "rss_growth_mib": samples, "second_half_growth_mib": round(samples[-1] - half, 1)}


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def start(argv: list[str], what: str) -> tuple[subprocess.Popen, int]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    if "serving" not in line:
        proc.kill()
        raise SystemExit(f"{what} did not start: {line!r}")
    return proc, int(line.rsplit(":", 1)[1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=5.0, help="duration of each cell (default 5)")
    p.add_argument("--concurrency", default="1,32", help="comma-separated connection counts (default 1,32)")
    p.add_argument("--tokens", type=int, default=32, help="tokens per response, one chunk each when streaming (default 32)")
    p.add_argument("--pin", action="store_true", help="the router on one CPU, the client and the engine on another")
    p.add_argument("--only", choices=("direct", "router"), help="measure one target only")
    p.add_argument("--slow-streams", type=int, metavar="N",
                   help="instead: N streams that are never read (a sim pacing 2000 tokens/s each), the router's memory over time")
    p.add_argument("--no-freeze", action="store_true", help="the router process does not gc.freeze() after starting")
    p.add_argument("--serve-router", type=int, metavar="PORT", help=argparse.SUPPRESS)
    p.add_argument("--profile", metavar="FILE", help="with the router: write a cProfile of it to FILE")
    args = p.parse_args()
    if args.serve_router:
        return serve_router(args.serve_router, args.profile, not args.no_freeze)

    import psutil

    pace = ["--tokens-per-s", "2000", "--output-tokens", "1000000"] if args.slow_streams else ["--output-tokens", str(args.tokens)]
    sim, sim_port = start([sys.executable, "-m", "llmgw.sim", "--model", MODEL, "--port", "0", "--quiet",
                           "--ttft-ms", "0", *pace], "the simulator")
    router, router_port = start([sys.executable, __file__, "--serve-router", str(sim_port),
                                 *(["--profile", args.profile] if args.profile else []),
                                 *(["--no-freeze"] if args.no_freeze else [])], "the router")
    try:
        cpus = sorted(os.sched_getaffinity(0))
        if args.pin and len(cpus) >= 2:
            os.sched_setaffinity(router.pid, {cpus[1]})
            os.sched_setaffinity(sim.pid, {cpus[0]})
            os.sched_setaffinity(0, {cpus[0]})
        proc = psutil.Process(router.pid)
        if args.slow_streams:
            print(f"{args.slow_streams} slow-reading streams for {args.seconds:g} s:")
            print(json.dumps(slow_streams(router.pid, router_port, args.slow_streams, args.seconds)))
            return 0
        print(f"router hot path: {args.tokens} tokens per response, {args.seconds:g} s per cell, "
              f"{'pinned' if args.pin else 'not pinned'}, Python {sys.version.split()[0]}, {len(cpus)} CPUs")
        print(f"{'target':<8}{'mode':<14}{'conc':>5}{'requests':>10}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}"
              f"{'ttfb p50':>10}{'CPU ms/req':>12}{'kernel':>8}")
        rows = []
        for concurrency in [int(c) for c in args.concurrency.split(",")]:
            for stream in (False, True):
                for target, port in (("direct", sim_port), ("router", router_port)):
                    if args.only and target != args.only:
                        continue
                    t0 = proc.cpu_times()
                    latencies, ttfbs, elapsed = asyncio.run(cell(port, concurrency, stream, args.seconds))
                    t1 = proc.cpu_times()
                    n = len(latencies)
                    cpu = (t1.user + t1.system - t0.user - t0.system) * 1000 / n if target == "router" else None
                    sys_share = (t1.system - t0.system) / max(1e-9, t1.user + t1.system - t0.user - t0.system)
                    row = {
                        "target": target, "mode": "streaming" if stream else "non-streaming", "concurrency": concurrency,
                        "requests": n, "rps": round(n / elapsed), "p50_ms": round(percentile(latencies, 50) * 1000, 3),
                        "p99_ms": round(percentile(latencies, 99) * 1000, 3),
                        "ttfb_p50_ms": round(percentile(ttfbs, 50) * 1000, 3),
                        "router_cpu_ms_per_req": round(cpu, 4) if cpu is not None else None,
                        "router_cpu_kernel_share": round(sys_share, 2) if cpu is not None else None,
                    }
                    rows.append(row)
                    print(f"{target:<8}{row['mode']:<14}{concurrency:>5}{n:>10}{row['rps']:>9}{row['p50_ms']:>9.3f}"
                          f"{row['p99_ms']:>9.3f}{row['ttfb_p50_ms']:>10.3f}"
                          f"{'' if cpu is None else format(cpu, '.3f'):>12}{'' if cpu is None else format(sys_share, '.0%'):>8}",
                          flush=True)
        print()
        for row in rows:
            print(json.dumps(row))
        pairs = {(r["mode"], r["concurrency"], r["target"]): r for r in rows}
        for (mode, conc, target), r in pairs.items():
            d = pairs.get((mode, conc, "direct"))
            if target == "router" and d is not None:
                print(f"added by the router, {mode} at {conc}: p50 {r['p50_ms'] - d['p50_ms']:+.3f} ms, "
                      f"p99 {r['p99_ms'] - d['p99_ms']:+.3f} ms, ttfb p50 {r['ttfb_p50_ms'] - d['ttfb_p50_ms']:+.3f} ms")
    finally:
        for proc_ in (router, sim):
            proc_.terminate()
            try:
                proc_.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc_.kill()
                proc_.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
