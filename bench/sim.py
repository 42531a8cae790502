"""How fast is the simulator?  Requests/s and latency from a small asyncio client.

    .venv/bin/python bench/sim.py [--seconds 5] [--concurrency 1,32] [--tokens 32]

Starts ``python -m llmgw.sim --quiet --ttft-ms 0`` and, for each concurrency,
sends non-streaming and streaming chat completions over keep-alive
connections for ``--seconds`` each.  With two or more CPUs the simulator is
pinned to one and the client to another, so "sim CPU" near 100% means the
simulator was the limit and lower means the client was; "req/sim-CPU-s" is
requests per second of the simulator's CPU time, what one core of it serves
when something else is the limit.  Not a test: it prints figures and asserts
nothing.
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


class Connection(asyncio.Protocol):
    """One keep-alive connection sending one request at a time; knows just enough HTTP for the simulator."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.done: asyncio.Future | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_exception(ConnectionError("the simulator closed the connection"))

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(buf[:end]).lower()
        i = head.find(b"content-length: ")
        if i >= 0:
            length = int(head[i + 16 : head.find(b"\r\n", i) if head.find(b"\r\n", i) > 0 else None])
            if len(buf) >= end + 4 + length:
                self._finish(head, end + 4 + length)
        elif buf.endswith(b"\r\n0\r\n\r\n"):
            self._finish(head, len(buf))

    def _finish(self, head: bytes, size: int) -> None:
        if not head.startswith(b"http/1.1 200"):
            self.done.set_exception(RuntimeError(head.split(b"\r\n")[0].decode()))
        else:
            self.done.set_result(None)
        del self.buf[:size]

    async def exchange(self, request: bytes) -> None:
        self.done = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        await self.done


def request_bytes(model: str, stream: bool) -> bytes:
    body = json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": "Say something about the weather in Lisbon today."}],
            "stream": stream,
        }
    ).encode()
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        b"Accept: application/json\r\nUser-Agent: llmgw-bench\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body)
    )


async def cell(port: int, concurrency: int, stream: bool, seconds: float, model: str) -> tuple[int, list[float], float]:
    loop = asyncio.get_running_loop()
    request = request_bytes(model, stream)
    conns = []
    for _ in range(concurrency):
        _, conn = await loop.create_connection(Connection, "127.0.0.1", port)
        conns.append(conn)
    latencies: list[float] = []
    # Warm up each connection once.
    await asyncio.gather(*(c.exchange(request) for c in conns))
    start = time.perf_counter()
    deadline = start + seconds

    async def worker(conn: Connection) -> None:
        clock = time.perf_counter
        while True:
            t0 = clock()
            if t0 >= deadline:
                return
            await conn.exchange(request)
            latencies.append(clock() - t0)

    await asyncio.gather(*(worker(c) for c in conns))
    elapsed = time.perf_counter() - start
    for c in conns:
        c.transport.close()
    return len(latencies), latencies, elapsed


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=5.0, help="duration of each cell (default 5)")
    p.add_argument("--concurrency", default="1,32", help="comma-separated connection counts (default 1,32)")
    p.add_argument("--tokens", type=int, default=32, help="tokens per response, one chunk each when streaming (default 32)")
    p.add_argument("--no-pin", action="store_true", help="do not pin the simulator and the client to separate CPUs")
    args = p.parse_args()
    model = "bench"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    sim = subprocess.Popen(
        [sys.executable, "-m", "llmgw.sim", "--model", model, "--port", "0", "--quiet",
         "--ttft-ms", "0", "--output-tokens", str(args.tokens)],
        stdout=subprocess.PIPE, text=True, env=env,
    )
    try:
        line = sim.stdout.readline()
        if "serving" not in line:
            print(f"the simulator did not start: {line!r}", file=sys.stderr)
            return 1
        port = int(line.rsplit(":", 1)[1])
        cpus = sorted(os.sched_getaffinity(0))
        pinned = not args.no_pin and len(cpus) >= 2
        if pinned:
            os.sched_setaffinity(sim.pid, {cpus[0]})
            os.sched_setaffinity(0, {cpus[1]})
        print(f"llmgw.sim benchmark: {args.tokens} tokens per response, {args.seconds:g} s per cell, "
              f"{'simulator and client pinned to one CPU each' if pinned else 'not pinned'}, Python {sys.version.split()[0]}")
        print(f"{'mode':<14}{'conc':>5}{'requests':>10}{'req/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'sim CPU':>9}{'req/sim-CPU-s':>15}")
        for concurrency in [int(c) for c in args.concurrency.split(",")]:
            for stream in (False, True):
                cpu0 = cpu_seconds(sim.pid)
                n, latencies, elapsed = asyncio.run(cell(port, concurrency, stream, args.seconds, model))
                cpu = (cpu_seconds(sim.pid) - cpu0) / elapsed
                print(f"{'streaming' if stream else 'non-streaming':<14}{concurrency:>5}{n:>10}{n / elapsed:>10.0f}"
                      f"{percentile(latencies, 50) * 1000:>9.2f}{percentile(latencies, 99) * 1000:>9.2f}{cpu:>8.0%}{n / elapsed / cpu if cpu else 0:>15.0f}",
                      flush=True)
    finally:
        sim.terminate()
        sim.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
