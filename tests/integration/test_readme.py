"""README.rst's "On one machine, by hand" works as written: real twistd daemons, real TLS, a real request.

The blocks are read from between their ``.. one-machine-start`` /
``.. one-machine-end`` markers, so what runs is what a newcomer pastes.
Only the three ports change, to free ones, since other tests or a ``make
run`` may hold 7443, 8080 and 9090; each replacement is checked to have
been made.  ``llmgw`` and ``twistd`` on PATH are this Python's, running the
working tree.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from llmgw.agent.procs import marked_processes
from tests.support.cluster import ROOT, TWISTD, environment
from tests.support.net import free_port
from tests.support.procs import alive
from tests.support.wait import wait_for

README = ROOT / "README.rst"


def block(name: str) -> str:
    """The literal block between ``.. NAME-start`` and ``.. NAME-end`` in README.rst, dedented."""
    text = README.read_text()
    assert f".. {name}-start\n" in text and f".. {name}-end\n" in text, f"README.rst lost its {name} markers"
    body = text.split(f".. {name}-start\n", 1)[1].split(f".. {name}-end\n", 1)[0]
    head, literal = body.split("::\n", 1)
    assert head.strip() == "", f"the {name} block should be one literal block, found {head!r} before it"
    return textwrap.dedent(literal).strip() + "\n"


def shims(directory: Path) -> dict[str, str]:
    """A PATH whose llmgw and twistd are this interpreter's."""
    directory.mkdir()
    commands = {
        "llmgw": f'exec {sys.executable} -m llmgw "$@"',
        "twistd": f'exec {" ".join(TWISTD[:2])} "{TWISTD[2]}" "$@"',
    }
    for name, line in commands.items():
        path = directory / name
        path.write_text(f"#!/bin/sh\n{line}\n")
        path.chmod(0o755)
    return environment(PATH=f"{directory}{os.pathsep}{os.environ['PATH']}")


def with_free_ports(script: str) -> str:
    for port in ("7443", "8080", "9090"):
        assert port in script, f"the README block no longer uses port {port}; update this test"
        script = script.replace(port, str(free_port()))
    return script


def logs(home: Path) -> str:
    return "".join(f"----- {p}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(home.glob("*.log")))


def run(script: str, cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-e", "-c", script], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("curl") is None, reason="the README's request is a curl command")
def test_the_readme_one_machine_steps_work_as_written(tmp_path: Path) -> None:
    env = shims(tmp_path / "bin")
    home = tmp_path / "llmgw-one"
    # One shell for both blocks, as a reader's: the stop block uses what the
    # first exported.  Between them the test notes the pids, which twistd
    # removes with its pidfiles.
    script = with_free_ports(block("one-machine") + 'echo "--- stopping $(cat server.pid) $(cat agent.pid)"\n'
                             + block("one-machine-stop"))
    pids: list[int] = []
    try:
        try:
            out = run(script, tmp_path, env, timeout=120)
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"the README's steps did not finish in {e.timeout:g} s:\n{e.stdout}\n{e.stderr}\n{logs(home)}")
        assert out.returncode == 0, f"{out.stdout}\n{out.stderr}\n{logs(home)}"
        started, stopping = out.stdout.split("--- stopping", 1)
        pids = [int(p) for p in stopping.split("\n", 1)[0].split()]
        assert len(pids) == 2, stopping
        answer = json.loads(started[started.index('{"id"'):])
        assert answer["model"] == "echo" and answer["choices"][0]["message"]["content"]
        assert "node1" in stopping and "echo/0/0" in stopping  # the drain said what it stopped
        # The agent's first lines say where its state and weights are.
        assert f"state in {home / 'state'}, weights in {home / 'weights'}" in (home / "agent.log").read_text()
        # Stopped means stopped: both daemons and the engine the drain stopped.
        wait_for(lambda: not any(alive(pid) for pid in pids), 15, "the server and agent to exit")
        wait_for(lambda: marked_processes(home / "state") == [], 15, "no engine left running")
    finally:
        for pidfile in home.glob("*.pid"):
            pids.append(int(pidfile.read_text()))
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        for engine in marked_processes(home / "state"):
            os.killpg(engine.pgid, signal.SIGKILL)
