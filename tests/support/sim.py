"""The simulator as a real process on 127.0.0.1, and the fixtures that start it.

A conftest that wants them imports them: ``from tests.support.sim import sim, start_sim``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.cluster import ROOT
from tests.support.net import connect, read_response

MODEL = "sim-test"


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
        """The exit status, once the process has exited (within *timeout*)."""
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


@pytest.fixture(scope="module")
def sim():
    """A simulator with the defaults (answers at once), shared by a test module."""
    process = SimProcess()
    yield process
    process.stop()


@pytest.fixture
def start_sim():
    """start_sim(*flags, model=...) -> a SimProcess stopped at the end of the test."""
    started: list[SimProcess] = []

    def start(*args: str, **kw) -> SimProcess:
        process = SimProcess(*args, **kw)
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()
