"""A real ``llmgw-router`` process (twistd) serving static engines from its router.yaml, no control plane.

For tests that call the API from another process (the Node client, schemathesis,
chromium) or want the router exactly as an operator runs it::

    with RouterProcess(tmp_path, {MODEL: sim.base_url}, extra="  cors: {allow_origins: [...]}\\n") as router:
        openai.OpenAI(base_url=router.base_url + "/v1", ...)

*extra* is router.yaml text under ``router:`` (indented two spaces).  The
process's log is ``output()``; a failure to start names it.
"""

from __future__ import annotations

from pathlib import Path

from tests.support.cluster import Process, environment, twistd
from tests.support.net import connect, free_port, read_response
from tests.support.wait import wait_for

START_TIMEOUT_S = 30.0


class RouterProcess:
    def __init__(self, base: Path, endpoints: dict[str, str], extra: str = "", name: str = "router"):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        listed = ", ".join(f'{{model: {model}, url: "{url}"}}' for model, url in endpoints.items())
        self.config = base / f"{name}.yaml"
        self.config.write_text(f"""
listen: {{api: "tcp:{self.port}:interface=127.0.0.1", admin: null}}
router:
  endpoints: [{listed}]
{extra}""")
        self.process = Process(name, twistd("llmgw-router", self.config), base / f"{name}.log", environment())

    def start(self) -> RouterProcess:
        self.process.start()

        def answers() -> bool:
            assert self.process.running(), f"llmgw-router exited:\n{self.output()}"
            try:
                return self._models_status() in (200, 401)  # 401: a router with keys
            except OSError:
                return False

        try:
            wait_for(answers, START_TIMEOUT_S, "llmgw-router to answer GET /v1/models", detail=self.output)
        except BaseException:
            # __exit__ is not called when __enter__ raises: a router that never answered is stopped here.
            self.stop()
            raise
        return self

    def _models_status(self) -> int:
        with connect(self.port, timeout=5) as s:
            s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            return read_response(s.makefile("rb"))[0]

    def output(self) -> str:
        return self.process.output()

    def stop(self) -> None:
        self.process.stop()

    def __enter__(self) -> RouterProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
