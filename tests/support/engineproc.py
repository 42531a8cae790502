"""A real engine started as llmgw's agent starts it, without the agent: for tests that put a router in front of it.

The argv and environment are the engine adapter's own (``llmgw.engines``'s
``plan`` for a one-rank shard), so the engine runs as it would on a node::

    with EngineProcess(tmp_path, "llama.cpp", llama_server, "gemma-3-270m", gemma, ["-c", "2048"]) as engine:
        RouterProcess(tmp_path, {"gemma-3-270m": engine.base_url})

``start`` waits for the plan's health probe (``GET /health`` answering 200)
and names the engine's log when it does not come.
"""

from __future__ import annotations

import os
import signal
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

from llmgw.engines import adapter_for
from llmgw.records import ShardSpec
from tests.support.net import free_port
from tests.support.wait import wait_for


class EngineProcess:
    def __init__(self, base: Path, engine: str, binary: str, model: str, model_path: str, args: list[str]):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        spec = ShardSpec(shard_id=f"{model}/0/0", replica_id=f"{model}/0", model=model, engine=engine,
                         source=model_path, args=list(args))
        self.plan = adapter_for(engine).plan(spec, binary=binary, host="127.0.0.1", port=self.port,
                                             model_path=model_path)
        self.log = base / f"{engine}-{self.port}.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float) -> EngineProcess:
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(self.plan.argv, env={**os.environ, **self.plan.env}, stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        wait_for(self._healthy, timeout, f"{self.plan.argv[0]} to answer GET /health", interval=0.5,
                 detail=self.output)
        return self

    def _healthy(self) -> bool:
        assert self.proc.poll() is None, f"the engine exited ({self.proc.returncode}):\n{self.output()}"
        try:
            with urllib.request.urlopen(self.base_url + "/health", timeout=5) as answer:
                return answer.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:] if self.log.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)

    def __enter__(self) -> EngineProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
