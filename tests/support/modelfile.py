"""One model file served over HTTP on 127.0.0.1 from a thread, held open part-way until the test has looked.

A download that runs at some pace races the test watching it: on a loaded
machine it can finish before the test looks.  So instead of a pace the file
has stops: with ``stops=(1_000_000,)`` every response sends its first
million bytes, then waits at the stop (``reached`` counts the stops met)
until the test calls ``release()``, which lets each response go on to the
next stop or the end.  ``stop()`` releases everything, so a failed test
leaves no response waiting.
"""

from __future__ import annotations

import hashlib
import http.server
import threading


class ModelFile:
    def __init__(self, name: str, payload: bytes, stops: tuple[int, ...] = (), chunk: int = 100_000):
        assert list(stops) == sorted(stops) and all(0 < s < len(payload) for s in stops), \
            f"stops {stops} must rise, and lie inside the {len(payload)} bytes"
        self.name = name
        self.payload = payload
        self.stops = stops
        self.chunk = chunk
        self.sha256 = hashlib.sha256(payload).hexdigest()
        #: The path of every request, in order.
        self.requests: list[str] = []
        #: How many stops responses have reached (all responses together).
        self.reached = 0
        self._released = 0
        self._changed = threading.Condition()
        self._server: http.server.ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/{self.name}"

    def start(self) -> ModelFile:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self._server = server
        return self

    def release(self) -> None:
        """Let every response waiting at a stop go on to the next one (or the end)."""
        with self._changed:
            self._released += 1
            self._changed.notify_all()

    def stop(self) -> None:
        with self._changed:
            self._released = len(self.stops)
            self._changed.notify_all()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def _at_stop(self, index: int) -> None:
        with self._changed:
            self.reached += 1
            self._changed.notify_all()
            self._changed.wait_for(lambda: self._released > index)

    def _send(self, wfile) -> None:
        pos = 0
        for index, end in enumerate((*self.stops, len(self.payload))):
            while pos < end:
                piece = self.payload[pos:min(pos + self.chunk, end)]
                wfile.write(piece)
                wfile.flush()
                pos += len(piece)
            if index < len(self.stops):
                self._at_stop(index)


def _handler(served: ModelFile):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            served.requests.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", str(len(served.payload)))
            self.end_headers()
            try:
                served._send(self.wfile)
            except OSError:
                pass  # the client went away

        def log_message(self, *args):
            pass

    return Handler
