"""What the agent runs while installing (python -m venv, pip) is ended with its whole process group.

Real processes through the reactor; the timeout follows a ``Clock`` the test
advances.  A shell script leaves a child in the background that holds its
output open, as pip's build backends and forking engines do.
"""

from __future__ import annotations

import pytest
import pytest_twisted
from twisted.internet import defer, reactor
from twisted.internet.task import Clock

from llmgw.agent.engines.pip import Unusable, run_bounded
from tests.support.procs import alive
from tests.support.wait import until

LEAVE_A_CHILD = 'sleep 300 &\necho $! > "{pid}"\n'


def script(tmp_path, body: str) -> list[str]:
    path = tmp_path / "command.sh"
    path.write_text(LEAVE_A_CHILD.format(pid=tmp_path / "child") + body)
    return ["/bin/sh", str(path)]


def child(tmp_path) -> int:
    return int((tmp_path / "child").read_text())


@pytest_twisted.ensureDeferred
async def test_a_command_that_exits_while_its_child_holds_the_output_ends_at_once_and_the_child_goes(tmp_path):
    ran = defer.ensureDeferred(run_bounded(reactor, Clock(), script(tmp_path, "echo installed\n"), timeout_s=600))
    await until(lambda: ran.called, "the command's end to be seen while its child still ran")
    assert "installed" in await ran
    await until(lambda: not alive(child(tmp_path)), "the child it left to be killed")


@pytest_twisted.ensureDeferred
async def test_a_command_past_its_timeout_is_killed_with_its_whole_group(tmp_path):
    clock = Clock()
    ran = defer.ensureDeferred(run_bounded(reactor, clock, script(tmp_path, "echo building; exec sleep 300\n"),
                                           timeout_s=5))
    await until(lambda: (tmp_path / "child").exists() and (tmp_path / "child").read_text().strip(),
                "the command to start its child")
    clock.advance(5)
    with pytest.raises(Unusable) as refused:
        await ran
    assert "did not finish within 5 s" in str(refused.value)
    await until(lambda: not alive(child(tmp_path)), "the child to be killed with the command")


@pytest_twisted.ensureDeferred
async def test_a_cancelled_command_is_killed_with_its_whole_group(tmp_path):
    ran = defer.ensureDeferred(run_bounded(reactor, Clock(), script(tmp_path, "exec sleep 300\n"), timeout_s=600))
    await until(lambda: (tmp_path / "child").exists() and (tmp_path / "child").read_text().strip(),
                "the command to start its child")
    ran.cancel()
    with pytest.raises(defer.CancelledError):
        await ran
    await until(lambda: not alive(child(tmp_path)), "the child to be killed with the command")
