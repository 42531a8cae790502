"""A rank of a multi-node replica, for the supervisor's tests: gates are files the test creates.

    rank_standin.py leader --port P --rendezvous R --gates DIR
    rank_standin.py worker --join HOST:PORT

The leader serves GET /health at once; it listens on R only once DIR/rendezvous
exists, and answers POST /v1/completions 200 only once DIR/joined exists.
A worker connects to HOST:PORT (retrying) and holds the connection open.
"""

from __future__ import annotations

import argparse
import http.server
import os
import socket
import sys
import threading
import time


def leader(args) -> None:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.answer(200 if self.path == "/health" else 404)

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            joined = os.path.exists(os.path.join(args.gates, "joined"))
            print(f"rank standin: completion asked, joined={joined}", flush=True)
            self.answer(200 if self.path == "/v1/completions" and joined else 503)

        def answer(self, code):
            self.send_response(code)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    while not os.path.exists(os.path.join(args.gates, "rendezvous")):
        time.sleep(0.05)
    store = socket.create_server(("127.0.0.1", args.rendezvous))
    print(f"rank standin: rendezvous open on {args.rendezvous}", flush=True)
    held = []
    while True:
        conn, _ = store.accept()
        held.append(conn)


def worker(args) -> None:
    host, _, port = args.join.rpartition(":")
    while True:
        try:
            conn = socket.create_connection((host, int(port)), timeout=1)
            break
        except OSError:
            time.sleep(0.05)
    print(f"rank standin: joined {args.join}", flush=True)
    while conn.recv(1):
        pass
    print("rank standin: rank 0 closed the connection", flush=True)
    sys.exit(1)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=("leader", "worker"))
    p.add_argument("--port", type=int)
    p.add_argument("--rendezvous", type=int)
    p.add_argument("--gates")
    p.add_argument("--join")
    a = p.parse_args()
    leader(a) if a.role == "leader" else worker(a)
