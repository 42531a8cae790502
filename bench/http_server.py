"""What twisted.web would cost the router, against llmgw's own HTTP/1.1 path.

    .venv/bin/python bench/http_server.py [--seconds 5] [--concurrency 1,32]

The router's hot path is written on Twisted's raw transports (``llmgw.http11``)
instead of twisted.web; docs/design.rst gives the reason, and this script is
its measurement.  It starts three servers, one after another, each in a
process of its own on the epoll reactor, each doing the router's minimum for
a chat completion: read the request, decode its JSON body, answer.

- ``web``: a twisted.web ``Site`` whose resource decodes the body and answers
  a fixed completion;
- ``lean``: the same on a raw ``Protocol`` with ``llmgw.http11.RequestParser``
  and ``response_bytes``, as the router's server does;
- ``web-proxy``: twisted.web forwarding the body to a sim engine with
  twisted.web's client ``Agent`` (a persistent pool) and relaying the answer:
  what a router built on twisted.web would do per request.  Compare it with
  ``bench/router_hotpath.py``'s "router CPU ms/req", llmgw's router on the
  same engine.

For each, keep-alive clients post for ``--seconds`` at each concurrency, and
the server process's CPU (user + system, from psutil) is divided by the
requests answered.  Prints a table and one JSON line per cell.  Not a test:
it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time

BODY = json.dumps({
    "model": "bench", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8,
}).encode()
ANSWER = json.dumps({
    "id": "chatcmpl-bench", "object": "chat.completion", "created": 0, "model": "bench",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 4, "completion_tokens": 1, "total_tokens": 5},
}).encode()


# The servers -----------------------------------------------------------------------

def serve_web(port: int, upstream: str | None) -> None:
    from twisted.internet import epollreactor

    epollreactor.install()
    from twisted.internet import reactor
    from twisted.web import resource, server

    class Completions(resource.Resource):
        isLeaf = True

        def __init__(self):
            super().__init__()
            if upstream is not None:
                from twisted.web.client import Agent, HTTPConnectionPool

                pool = HTTPConnectionPool(reactor, persistent=True)
                pool.maxPersistentPerHost = 256
                self.agent = Agent(reactor, pool=pool)

        def render_POST(self, request):
            body = request.content.read()
            json.loads(body)
            if upstream is None:
                request.setHeader(b"content-type", b"application/json")
                return ANSWER
            return self._forward(request, body)

        def _forward(self, request, body):
            from twisted.web.client import FileBodyProducer, readBody
            from twisted.web.http_headers import Headers
            import io

            d = self.agent.request(b"POST", upstream.encode(), Headers({b"content-type": [b"application/json"]}),
                                   FileBodyProducer(io.BytesIO(body)))

            def relay(response):
                request.setResponseCode(response.code)
                request.setHeader(b"content-type", b"application/json")
                return readBody(response)

            def done(answer):
                request.setHeader(b"content-length", b"%d" % len(answer))
                request.write(answer)
                request.finish()

            def broken(failure):
                request.setResponseCode(502)
                request.finish()

            d.addCallback(relay).addCallbacks(done, broken)
            return server.NOT_DONE_YET

    site = server.Site(Completions())
    site.log = lambda request: None  # the access log is not part of the cost compared
    reactor.listenTCP(port, site, interface="127.0.0.1", backlog=1024)
    import gc

    gc.freeze()
    reactor.run()


def serve_lean(port: int) -> None:
    from twisted.internet import epollreactor

    epollreactor.install()
    from twisted.internet import reactor
    from twisted.internet.protocol import Factory, Protocol

    from llmgw.http11 import BadRequest, DateHeader, RequestParser, response_bytes

    date = DateHeader()

    class Lean(Protocol):
        def connectionMade(self):
            self.transport.setTcpNoDelay(True)
            self.parser = RequestParser()

        def dataReceived(self, data):
            self.parser.feed(data)
            while True:
                request = self.parser.next_request()
                if request is None:
                    return
                if isinstance(request, BadRequest):
                    self.transport.loseConnection()
                    return
                json.loads(request.body)
                self.transport.write(response_bytes(200, ANSWER, date()))

    factory = Factory.forProtocol(Lean)
    reactor.listenTCP(port, factory, interface="127.0.0.1", backlog=1024)
    import gc

    gc.freeze()
    reactor.run()


# The load --------------------------------------------------------------------------

REQUEST = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
           b"Content-Length: " + str(len(BODY)).encode() + b"\r\n\r\n" + BODY)


async def one_client(port: int, until: float, latencies: list[float]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        while time.perf_counter() < until:
            started = time.perf_counter()
            writer.write(REQUEST)
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))
            await reader.readexactly(length)
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"the server answered {head.splitlines()[0]!r}")
            latencies.append(time.perf_counter() - started)
    finally:
        writer.close()


async def load(port: int, concurrency: int, seconds: float) -> list[float]:
    latencies: list[float] = []
    until = time.perf_counter() + seconds
    await asyncio.gather(*(one_client(port, until, latencies) for _ in range(concurrency)))
    return latencies


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port: int, proc: subprocess.Popen, what: str, deadline_s: float = 30.0) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with {proc.returncode} before it listened")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"{what} did not listen on 127.0.0.1:{port} within {deadline_s:g} s")


def start(args: list[str], port: int, what: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, __file__, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wait_listening(port, proc, what)
    return proc


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def measure(name: str, proc: subprocess.Popen, port: int, concurrency: int, seconds: float) -> dict:
    import psutil

    asyncio.run(load(port, concurrency, 1.0))  # warm-up
    ps = psutil.Process(proc.pid)
    before = ps.cpu_times()
    latencies = asyncio.run(load(port, concurrency, seconds))
    after = ps.cpu_times()
    cpu_s = (after.user - before.user) + (after.system - before.system)
    latencies.sort()
    n = len(latencies)
    return {
        "server": name, "concurrency": concurrency, "requests": n, "req_per_s": round(n / seconds),
        "server_cpu_ms_per_req": round(1000 * cpu_s / n, 4) if n else None,
        "p50_ms": round(1000 * latencies[n // 2], 3) if n else None,
        "p99_ms": round(1000 * latencies[min(n - 1, int(n * 0.99))], 3) if n else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", default="1,32")
    parser.add_argument("--serve", choices=["web", "lean", "web-proxy"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--upstream", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve == "lean":
        serve_lean(args.port)
        return
    if args.serve is not None:
        serve_web(args.port, args.upstream if args.serve == "web-proxy" else None)
        return

    levels = [int(c) for c in args.concurrency.split(",")]
    sim_port = free_port()
    sim = subprocess.Popen([sys.executable, "-m", "llmgw.sim", "--quiet", "--host", "127.0.0.1", "--port",
                            str(sim_port), "--model", "bench", "--ttft-ms", "0", "--output-tokens", "8"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    rows = []
    try:
        wait_listening(sim_port, sim, "the sim engine")
        upstream = f"http://127.0.0.1:{sim_port}/v1/chat/completions"
        for name, extra in (("lean", []), ("web", []), ("web-proxy", ["--upstream", upstream])):
            port = free_port()
            proc = start(["--serve", name, "--port", str(port), *extra], port, f"the {name} server")
            try:
                for concurrency in levels:
                    rows.append(measure(name, proc, port, concurrency, args.seconds))
            finally:
                stop(proc)
    finally:
        stop(sim)
    print(f"{'server':<10} {'conc':>4} {'req/s':>8} {'cpu ms/req':>11} {'p50 ms':>8} {'p99 ms':>8}")
    for r in rows:
        print(f"{r['server']:<10} {r['concurrency']:>4} {r['req_per_s']:>8} {r['server_cpu_ms_per_req']:>11} "
              f"{r['p50_ms']:>8} {r['p99_ms']:>8}")
    for r in rows:
        print(json.dumps(r))
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
