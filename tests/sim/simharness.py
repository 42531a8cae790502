"""The simulator as a real process on 127.0.0.1, and just enough HTTP to talk to it over raw sockets.

Everything waits for a condition with a deadline and says what it waited for.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]
MODEL = "sim-test"


def wait_for(predicate, timeout: float, what: str, interval: float = 0.02):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (last: {last!r})")


class SimProcess:
    """``python -m llmgw.sim --host 127.0.0.1 --port 0 --model MODEL ARGS``, its port read from its first line."""

    def __init__(self, *args: str, model: str = MODEL):
        self.model = model
        env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "llmgw.sim", "--host", "127.0.0.1", "--port", "0", "--model", model, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        line = self.wait_for_line(lambda l: l.startswith("sim: serving"), timeout=20)
        m = re.fullmatch(r"sim: serving (.+) on http://127\.0\.0\.1:(\d+)", line)
        assert m is not None, f"unexpected first line {line!r}"
        assert m.group(1) == model
        self.port = int(m.group(2))
        assert self.port != 0
        self.base_url = f"http://127.0.0.1:{self.port}"

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def wait_for_line(self, predicate, timeout: float = 10) -> str:
        deadline = time.monotonic() + timeout
        seen = 0
        with self._changed:
            while True:
                for line in self.lines[seen:]:
                    if predicate(line):
                        return line
                seen = len(self.lines)
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    raise AssertionError(
                        f"no such line from the simulator within {timeout:g} s; it said:\n" + "\n".join(self.lines)
                    )
                self._changed.wait(min(remaining, 0.1))

    def request(self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None):
        """One request on a fresh connection: (status, headers, body)."""
        with connect(self.port) as s:
            fields = {"Host": "sim", "Content-Length": str(len(body)), **(headers or {})}
            head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields.items()) + "\r\n"
            s.sendall(head.encode() + body)
            return read_response(s.makefile("rb"))

    def metrics(self) -> dict[str, float]:
        """Every sample of /metrics, parsed by prometheus_client, keyed as name{labels}."""
        status, _, body = self.request("GET", "/metrics")
        assert status == 200
        samples = {}
        for family in text_string_to_metric_families(body.decode()):
            for sample in family.samples:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
                samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
        return samples

    def gauge(self, name: str) -> float:
        return self.metrics()[f'{name}{{model_name="{self.model}"}}']

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def wait(self, timeout: float = 10) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self._reader.join(timeout=10)
        self.proc.stdout.close()


def connect(port: int, timeout: float = 10) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.settimeout(timeout)
    return s


def read_response(f) -> tuple[int, dict[str, str], bytes]:
    """One response from a buffered socket file: Content-Length, chunked, or read until close."""
    status_line = f.readline()
    assert status_line.startswith(b"HTTP/1.1 "), f"not a response: {status_line!r}"
    status = int(status_line.split()[1])
    headers: dict[str, str] = {}
    while True:
        line = f.readline()
        assert line.endswith(b"\r\n"), f"truncated head: {line!r}"
        if line == b"\r\n":
            break
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    if status == 100:
        return status, headers, b""
    if "content-length" in headers:
        body = f.read(int(headers["content-length"]))
    elif headers.get("transfer-encoding") == "chunked":
        parts = []
        while True:
            size = int(f.readline().split(b";")[0], 16)
            if size == 0:
                assert f.readline() == b"\r\n"
                break
            parts.append(f.read(size))
            assert f.read(2) == b"\r\n"
        body = b"".join(parts)
    else:
        body = f.read()
    return status, headers, body


def sse_events(body: bytes) -> list[str]:
    """The data of each server-sent event in a body."""
    events = body.decode().split("\n\n")
    assert events[-1] == "", f"the stream does not end with a blank line: {body[-40:]!r}"
    out = []
    for event in events[:-1]:
        assert event.startswith("data: "), event
        out.append(event[len("data: "):])
    return out
