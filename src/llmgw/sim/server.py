"""Running the simulator: listen, announce the address, serve until SIGTERM or --fail-after."""

from __future__ import annotations

import asyncio
import gc
import signal
import sys
from typing import Sequence, TextIO

from llmgw.sim.connection import HTTPConnection
from llmgw.sim.engine import SimEngine
from llmgw.http11 import DateHeader
from llmgw.sim.options import SimOptions, parse


def url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


async def serve(options: SimOptions, *, out: TextIO = sys.stdout) -> int:
    """Serve until stopped; the exit status: 0 on SIGTERM or SIGINT, 1 after --fail-after."""
    loop = asyncio.get_running_loop()
    stopped: asyncio.Future[int] = loop.create_future()

    def stop(code: int) -> None:
        if not stopped.done():
            stopped.set_result(code)

    connections: set[HTTPConnection] = set()
    date = DateHeader()
    sim: SimEngine | None = None
    try:
        server = await loop.create_server(
            lambda: HTTPConnection(sim, connections, date, max_body_bytes=options.max_body_bytes),
            options.host,
            options.port,
            reuse_address=True,
            backlog=1024,
            start_serving=False,
        )
    except OSError as e:
        print(f"sim: cannot listen on {options.host}:{options.port}: {e.strerror or e}", file=sys.stderr)
        return 1
    port = server.sockets[0].getsockname()[1]
    sim = SimEngine(options, port=port, out=out, on_exit=stop)
    sim.start(loop)
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop, 0)
    await server.start_serving()
    out.write(f"sim: serving {options.model} on {url(options.host, port)}\n")
    out.flush()
    # Everything allocated so far lives as long as the process: keep the
    # collector from walking it again and again under load.
    gc.freeze()
    try:
        code = await stopped
    finally:
        sim.stopping = True
        server.close()
        for conn in list(connections):
            conn.close()
    return code


def main(argv: Sequence[str] | None = None) -> int:
    options = parse(argv)
    # One line per request, visible at once to whoever reads the pipe.
    sys.stdout.reconfigure(line_buffering=True)
    return asyncio.run(serve(options))
