"""`llmgw-tui` in a real terminal: tmux at 80x24, keys sent, the screen read back.

The tmux server is this test's own (``-L`` names a private socket), so it
never touches a person's sessions, and is killed at the end.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import uuid

import pytest

from tests.support.cluster import ROOT, environment
from tests.support.wait import wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install tmux)"),
]


class Tmux:
    def __init__(self):
        self.socket = f"llmgw-test-{uuid.uuid4().hex[:8]}"
        self.started = False

    def __call__(self, *args: str) -> str:
        out = subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=10)
        assert out.returncode == 0, f"tmux {' '.join(args)}: {out.stderr}"
        return out.stdout

    def start(self, command: list[str], env: dict[str, str], size: tuple[int, int] = (80, 24)) -> None:
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items() if k in ("PYTHONPATH", "HOME", "PATH"))
        # The shell stays a while after the program, so what it printed last can be read.
        self("new-session", "-d", "-s", "tui", "-x", str(size[0]), "-y", str(size[1]),
             f"cd {shlex.quote(str(ROOT))} && env {exports} {shlex.join(command)}; "
             'echo "exited with $?"; sleep 120')
        self.started = True

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "tui")

    def wait_screen(self, predicate, what: str, timeout: float = 20) -> str:
        try:
            return wait_for(lambda: (lambda s: s if predicate(s) else None)(self.screen()), timeout, what, interval=0.2)
        except AssertionError as e:
            raise AssertionError(f"{e}\nthe screen:\n{self.screen()}") from None

    def kill(self) -> None:
        if self.started:
            subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=10)


LAUNCHES = 4


@pytest.fixture
def tmux():
    t = Tmux()
    yield t
    t.kill()


def test_llmgw_tui_in_tmux_shows_the_fleet_answers_keys_and_quits(cluster, tmux):
    cluster.start_server()
    cluster.start_agent("node01")
    cluster.wait_node("node01", "ready")
    tmux.start(tui_command(cluster), environment(HOME=os.environ.get("HOME", "/root")))

    screen = tmux.wait_screen(lambda s: "node01" in s and "ready" in s and "Nodes 1/1 ready" in s, "node01 ready")
    lines = screen.splitlines()
    assert len(lines) <= 24 and all(len(line) <= 80 for line in lines)
    assert "? Keys" in screen and "q Quit" in screen

    tmux("send-keys", "-t", "tui", "?")
    tmux.wait_screen(lambda s: "Keys" in s and "drain the node" in s and "Esc or ? closes" in s, "the keys")
    tmux("send-keys", "-t", "tui", "Escape")
    tmux.wait_screen(lambda s: "drain the node" not in s and "node01" in s, "the keys to close")

    tmux("send-keys", "-t", "tui", "Tab")
    tmux.wait_screen(lambda s: "MODEL" in s and "PROGRESS / REASON" in s, "the replicas pane")

    tmux("send-keys", "-t", "tui", "q")
    screen = tmux.wait_screen(lambda s: "exited with" in s, "llmgw-tui to exit after q")
    assert "exited with 0" in screen


def tui_command(cluster) -> list[str]:
    pki = cluster.pki
    return [sys.executable, "-m", "llmgw.tui", "--hub", cluster.hub, "--ca", str(pki / "ca.crt"),
            "--cert", str(pki / "alice.crt"), "--key", str(pki / "alice.key")]


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
def test_the_first_screen_shows_the_node_row_as_soon_as_the_fleet_is_loaded(cluster, size):
    """Launched afresh several times: once the tab line says the node is ready, its row is on screen, every time.

    The table's horizontal scrollbar, which appears once its columns are
    measured, used to take the only row's line until the next event.
    """
    cluster.start_server()
    cluster.start_agent("node01")
    cluster.wait_node("node01", "ready")
    for launch in range(LAUNCHES):
        tmux = Tmux()
        try:
            tmux.start(tui_command(cluster), environment(HOME=os.environ.get("HOME", "/root")), size)
            # Waits for the data only; the row is then looked for once.
            screen = tmux.wait_screen(lambda s: "Nodes 1/1 ready" in s, "the tab line to count node01 ready")
            rows = [line for line in screen.splitlines()[1:] if line.lstrip().startswith("node01")]
            assert rows and "ready" in rows[0], f"launch {launch + 1}: no node01 row under the tab line:\n{screen}"
        finally:
            tmux.kill()
