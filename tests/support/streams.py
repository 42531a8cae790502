"""A streaming chat completion read on its own thread, as a client sees it, and a router over several engines of one model.

For tests that break an engine mid-answer (tests/router/test_continuing.py, the
fault suite) and compare what each client read with the whole answer.
"""

from __future__ import annotations

import json
import socket
import threading
import time

from tests.support.cluster import Process, environment, twistd
from tests.support.net import connect, free_port, read_response
from tests.support.wait import wait_for


class Stream:
    """One streaming chat completion read on its own thread: the content pieces, usage, errors, the longest gap."""

    def __init__(self, port: int, model: str, words: list[str], max_tokens: int, include_usage: bool = True,
                 **fields):
        self.port = port
        self.pieces: list[str] = []
        self.usage = None
        self.errors: list[str] = []
        self.ids: set[str] = set()
        self.done = False
        self.gap = 0.0
        # The system_fingerprint of each engine that sent part of the answer (the sim's names its port).
        self.engines: list[str] = []
        body = json.dumps({"model": model, "stream": True, "max_tokens": max_tokens,
                           "stream_options": {"include_usage": include_usage},
                           "messages": [{"role": "user", "content": " ".join(words)}], **fields}).encode()
        self.request = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                        b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=60) as s:
                s.sendall(self.request)
                f = s.makefile("rb")
                status = f.readline()
                if b" 200 " not in status:
                    self.errors.append(status.decode())
                    return
                while f.readline() not in (b"\r\n", b""):
                    pass
                last = time.monotonic()
                buf = b""
                while True:
                    size = f.readline()
                    if not size:
                        self.errors.append("the connection closed mid-stream")
                        return
                    n = int(size.split(b";")[0], 16)
                    data = f.read(n + 2)[:n]
                    now = time.monotonic()
                    self.gap = max(self.gap, now - last)
                    last = now
                    if n == 0:
                        return
                    buf += data
                    *events, buf = buf.split(b"\n\n")
                    for event in events:
                        self._event(event)
        except OSError as e:
            self.errors.append(repr(e))

    def _event(self, event: bytes) -> None:
        payload = event.removeprefix(b"data: ")
        if payload == b"[DONE]":
            self.done = True
            return
        obj = json.loads(payload)
        if "error" in obj:
            self.errors.append(obj["error"]["message"])
            return
        self.ids.add(obj["id"])
        engine = obj.get("system_fingerprint")
        if engine and (not self.engines or self.engines[-1] != engine):
            self.engines.append(engine)
        if obj.get("usage"):
            self.usage = obj["usage"]
        for choice in obj["choices"]:
            content = choice["delta"].get("content")
            if content:
                self.pieces.append(content)

    @property
    def text(self) -> str:
        return "".join(self.pieces)


class StaticRouter:
    """llmgw-router with every given engine as a static endpoint of *model*, 64 requests a slot each."""

    def __init__(self, base, model: str, urls: list[str], extra: str = ""):
        self.port = free_port()
        listed = ", ".join(f'{{model: {model}, url: "{url}"}}' for url in urls)
        config = base / "router.yaml"
        config.write_text(f"""
listen: {{api: "tcp:{self.port}:interface=127.0.0.1", admin: "tcp:{free_port()}:interface=127.0.0.1"}}
router:
  endpoints: [{listed}]
  admission: {{max_inflight_per_endpoint: 64}}
{extra}""")
        self.process = Process("router", twistd("llmgw-router", config), base / "router.log", environment())

    def __enter__(self):
        self.process.start()

        def answers():
            assert self.process.running(), self.process.output()
            try:
                with connect(self.port, timeout=5) as s:
                    s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                    return read_response(s.makefile("rb"))[0] == 200
            except OSError:
                return False

        try:
            wait_for(answers, 30, "the router to answer", detail=self.process.output)
        except BaseException:
            self.process.stop()  # __exit__ is not called when __enter__ fails
            raise
        return self

    def __exit__(self, *exc):
        self.process.stop()
