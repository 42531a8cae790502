"""A probe of an engine (``--version``, ``ldd``, an import) is bounded: what is read, how long, and its whole group.

Real processes: shell scripts that print without end, hang, or leave a
child behind holding their output open.  A child left running is looked for
by its pid from outside (``tests/support/procs.py``).
"""

from __future__ import annotations

import time

import pytest

from llmgw.engines import llamacpp as llamacpp_module
from llmgw.engines.llamacpp import LlamaCpp
from llmgw.engines.probes import MAX_OUTPUT_BYTES, ProbeFailed, missing_libraries, run_probe
from tests.support.procs import alive
from tests.support.wait import wait_for

LLAMA = LlamaCpp()

# A child in the background that outlives the script: it keeps the script's output open.
LEAVE_A_CHILD = 'sleep 300 &\necho $! > "$0.child"\n'


def child_of(path: str) -> int:
    wait_for(lambda: open(f"{path}.child").read().strip(), 10, "the script to write its child's pid")
    return int(open(f"{path}.child").read())


def test_a_version_that_prints_without_end_is_stopped_at_the_limit_and_refused(script):
    # 300 MB printed by --version once made the agent hold 900 MB.
    path = script("llama-server", "exec yes 'version: 6000 (abc1234)'\n")
    with pytest.raises(ProbeFailed) as refused:
        run_probe([path, "--version"], 30)
    assert str(refused.value) == (f"{path} --version printed more than 1 MiB and was stopped: an engine's probe "
                                  f"prints a few lines; check that {path} is the engine")
    assert len(refused.value.output) <= MAX_OUTPUT_BYTES


def test_an_adapters_probe_is_bounded_the_same_way(script):
    path = script("llama-server", "head -c 8000000 /dev/zero | tr '\\0' x\necho 'version: 6000 (abc1234)' >&2\n")
    result = LLAMA.probe_detail(path)
    assert result.info is None and "printed more than 1 MiB and was stopped" in result.reason


def test_a_probe_past_its_timeout_is_killed_with_its_whole_group(script, monkeypatch):
    monkeypatch.setattr(llamacpp_module, "VERSION_TIMEOUT_S", 0.5)
    path = script("llama-server", LEAVE_A_CHILD + "exec sleep 30\n")
    result = LLAMA.probe_detail(path)
    assert result.reason == f"{path} --version did not finish within 0.5 s"
    wait_for(lambda: not alive(child_of(path)), 10, "the probe's child to be killed with it")


def test_a_probe_that_answers_while_a_child_holds_its_output_is_read_at_once(script):
    path = script("llama-server", LEAVE_A_CHILD + "echo 'version: 6000 (abc1234)' >&2\n")
    started = time.monotonic()
    assert "version: 6000" in run_probe([path, "--version"], 60)
    assert time.monotonic() - started < 30, "it waited on the child that held the output open"
    wait_for(lambda: not alive(child_of(path)), 10, "what the probe left behind to be killed")


def test_ldd_is_bounded_too(script, tmp_path, monkeypatch):
    fake = tmp_path / "bin"
    fake.mkdir()
    script("ldd", LEAVE_A_CHILD + "echo '\tlibllmgw-gone.so.1 => not found'\nexec yes '\tlibc.so.6 => /lib/libc.so.6'\n",
           directory=fake)
    monkeypatch.setenv("PATH", f"{fake}:/usr/bin:/bin")
    started = time.monotonic()
    assert missing_libraries(str(tmp_path / "llama-server"), timeout_s=30) == ["libllmgw-gone.so.1"]
    assert time.monotonic() - started < 20
    wait_for(lambda: not alive(child_of(str(fake / "ldd"))), 10, "ldd's child to be killed")
