"""An engine stand-in for the supervisor's tests: a real process, serving a real socket.

    standin_engine.py --port P [--healthy-after S | --never-healthy] [--lines N]
                      [--exit-after S --exit-code C] [--ignore-term] [--chatter S]
                      [--fork-child] [--fork-escapee]

GET /health answers 503 until it is healthy, then 200. Everything it does is
said on stdout or stderr, flushed, so the tests can read it in the log.
"""

from __future__ import annotations

import argparse
import http.server
import os
import signal
import subprocess
import sys
import threading
import time


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--healthy-after", type=float, default=0.0)
    p.add_argument("--never-healthy", action="store_true")
    p.add_argument("--lines", type=int, default=0)
    p.add_argument("--exit-after", type=float)
    p.add_argument("--exit-code", type=int, default=0)
    p.add_argument("--ignore-term", action="store_true")
    p.add_argument("--chatter", type=float)
    p.add_argument("--fork-child", action="store_true")
    p.add_argument("--fork-escapee", action="store_true", help="a child in a session of its own")
    args = p.parse_args()

    began = time.monotonic()

    def healthy() -> bool:
        return not args.never_healthy and time.monotonic() - began >= args.healthy_after

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            code = 200 if self.path == "/health" and healthy() else 503
            body = b"ok\n" if code == 200 else b"loading\n"
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    if args.ignore_term:
        signal.signal(signal.SIGTERM, lambda *a: print("standin: ignoring SIGTERM", flush=True))
    else:
        def on_term(*a):
            print("standin: got SIGTERM, exiting", flush=True)
            os._exit(0)

        signal.signal(signal.SIGTERM, on_term)

    print(f"standin pid {os.getpid()} pgid {os.getpgrp()} port {args.port}", flush=True)
    for i in range(args.lines):
        print(f"standin line {i}", flush=True)
    if args.lines:
        print("standin says this on stderr", file=sys.stderr, flush=True)
    if args.fork_child:
        child = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(1)"])
        print(f"standin child pid {child.pid}", flush=True)
    if args.fork_escapee:
        child = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(1)"],
                                 start_new_session=True)
        print(f"standin escapee pid {child.pid}", flush=True)

    server = http.server.ThreadingHTTPServer((args.host, args.port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    tick = 0
    while True:
        now = time.monotonic() - began
        if args.exit_after is not None and now >= args.exit_after:
            print(f"standin exiting with code {args.exit_code}", flush=True)
            os._exit(args.exit_code)
        if args.chatter:
            print(f"standin tick {tick}", flush=True)
            tick += 1
            time.sleep(args.chatter)
        else:
            time.sleep(0.05)


if __name__ == "__main__":
    main()
