"""vLLM and SGLang on a node: a pip spec installed into a venv of the node's own, a python: probed as given.

The package index is a PEP 503 folder built at test time and given as
``--index-url file:///…/simple``, so pip needs no network; the package is a
stand-in wheel whose ``__version__`` is set.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import pytest_twisted
from twisted.internet import defer, reactor
from twisted.internet.task import Clock

from llmgw.agent.engines import assets
from llmgw.agent.engines.install import MARKER, Installer
from llmgw.agent.engines.pip import Unusable, run_bounded, venv_key
from llmgw.records import EngineBuild, EngineInfo, EnginePlan
from llmgw.states import EngineState
from tests.support.engine_archives import simple_index, stand_in_wheel
from tests.support.wait import until

PLATFORM = assets.Platform(system="linux", machine="x86_64")


@pytest.fixture
def root(tmp_path):
    return tmp_path / "state" / "engines"


@pytest.fixture
def make(root):
    made: list[Installer] = []

    def make(clock=None) -> Installer:
        progress, changes = [], []
        one = Installer(reactor, root, platform=PLATFORM, progress=progress.append,
                        changed=lambda: changes.append(one.entries()), clock=clock, os_packages_manager=None)
        one.reports, one.changes = progress, changes
        made.append(one)
        one.start()
        return one

    yield make
    for one in made:
        one.stop()


@pytest.fixture
def index(tmp_path):
    wheels = [stand_in_wheel(tmp_path / "wheels", "vllm", v) for v in ("0.10.0", "0.11.0")]
    wheels.append(stand_in_wheel(tmp_path / "wheels", "sglang", "0.5.1"))
    return simple_index(tmp_path / "index", wheels)


def only(installer: Installer) -> EngineInfo:
    (entry,) = installer.entries()
    return entry


def left_in(root, name="vllm") -> list[str]:
    folder = root / name
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


@pytest_twisted.ensureDeferred
async def test_a_pip_spec_is_installed_into_a_venv_of_its_own_probed_and_marked(make, root, index):
    build = EngineBuild("vllm", "0.11.0", pip="vllm==0.11.0", index_url=index)
    installer = make()
    await installer.converge(EnginePlan([build]), set)
    venv = root / "vllm" / venv_key(build)
    python = str(venv / "bin" / "python")
    assert installer.entries() == [EngineInfo("vllm", "0.11.0", python, EngineState.INSTALLED, None, "server.yaml")]
    assert installer.binary("vllm", "0.11.0") == installer.binary("vllm", None) == python
    marker = json.loads((venv / MARKER).read_text())
    assert (marker["version"], marker["path"], marker["pip"], marker["index_url"]) == (
        "0.11.0", python, "vllm==0.11.0", index)
    # While pip ran the node said so; its progress travelled as a download's does.
    installing = [e.reason for entries in installer.changes for e in entries if e.state is EngineState.INSTALLING]
    assert "pip install vllm==0.11.0" in installing
    final = installer.reports[-1]
    assert (final.source, final.file_name, final.final, final.error) == ("pip:vllm==0.11.0", "vllm==0.11.0", True, None)
    assert final.bytes_done > 0
    # The venv is whole: its console script runs too, and the agent's own packages are not in it.
    done = subprocess.run([str(venv / "bin" / "vllm"), "--version"], capture_output=True, text=True, timeout=30)
    assert done.stdout.strip() == "0.11.0"
    leaked = subprocess.run([python, "-c", "import yaml"], capture_output=True, timeout=30, cwd=venv)
    assert leaked.returncode != 0


@pytest_twisted.ensureDeferred
async def test_a_package_reporting_another_version_is_broken_and_its_venv_removed(make, root, index):
    installer = make()
    await installer.converge(EnginePlan([EngineBuild("vllm", "0.11.0", pip="vllm<0.11", index_url=index)]), set)
    entry = only(installer)
    assert entry.state is EngineState.BROKEN
    assert entry.reason.endswith("has vllm 0.10.0, and engines.vllm.version in server.yaml says 0.11.0")
    assert left_in(root) == [] and installer.binary("vllm", None) is None


@pytest_twisted.ensureDeferred
async def test_pip_failing_is_broken_with_pips_last_words_and_nothing_left(make, root, index):
    installer = make()
    await installer.converge(EnginePlan([EngineBuild("vllm", pip="vllm==9.9", index_url=index)]), set)
    entry = only(installer)
    assert entry.state is EngineState.BROKEN
    assert "pip install --no-input --disable-pip-version-check --index-url" in entry.reason
    assert "exited with status 1: ERROR: No matching distribution found for vllm==9.9" in entry.reason
    assert left_in(root) == []
    assert installer.reports[-1].final and installer.reports[-1].error == entry.reason


@pytest.mark.slow
@pytest_twisted.ensureDeferred
async def test_a_restarted_agent_reports_its_venv_at_once_and_a_new_spec_replaces_it(make, root, index):
    old = EngineBuild("sglang", pip="sglang", index_url=index)
    first = make()
    await first.converge(EnginePlan([old]), set)
    assert only(first).version == "0.5.1"
    first.stop()
    again = make()
    assert again.entries() == first.entries()
    await again.converge(EnginePlan([old]), set)
    assert only(again).state is EngineState.INSTALLED and left_in(root, "sglang") == [venv_key(old)]
    # Another spec is another venv; the old one goes once nothing runs it.
    new = EngineBuild("sglang", "0.5.1", pip="sglang==0.5.1", index_url=index)
    await again.converge(EnginePlan([new]), set)
    assert [e.state for e in again.entries()] == [EngineState.INSTALLED]
    await until(lambda: left_in(root, "sglang") == [venv_key(new)], "the old venv to be removed",
                detail=lambda: repr(left_in(root, "sglang")))


def python_with(tmp_path, module: str, version: str) -> str:
    """An interpreter the site provides, which imports *module* at *version* (and never was pip'ed here)."""
    site = tmp_path / "site"
    (site / module).mkdir(parents=True)
    (site / module / "__init__.py").write_text(f"__version__ = {version!r}\n")
    python = tmp_path / "site-python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    return str(python)


@pytest_twisted.ensureDeferred
async def test_a_python_build_is_probed_as_given_and_never_installed(tmp_path, make, root):
    python = python_with(tmp_path, "vllm", "0.11.0")
    installer = make()
    await installer.converge(EnginePlan([EngineBuild("vllm", "0.11.0", python=python)]), set)
    assert installer.entries() == [EngineInfo("vllm", "0.11.0", python, EngineState.INSTALLED, None, "server.yaml")]
    assert installer.binary("vllm", "0.11.0") == python
    assert not root.exists() or left_in(root) == []


@pytest_twisted.ensureDeferred
async def test_a_folder_named_like_the_engine_in_the_agents_working_directory_is_not_imported(tmp_path, make,
                                                                                              monkeypatch):
    (tmp_path / "cwd" / "vllm").mkdir(parents=True)
    (tmp_path / "cwd" / "vllm" / "__init__.py").write_text("__version__ = 'from the working directory'\n")
    monkeypatch.chdir(tmp_path / "cwd")
    installer = make()
    await installer.converge(EnginePlan([EngineBuild("vllm", python=sys.executable)]), set)
    assert only(installer).state is EngineState.BROKEN
    assert only(installer).reason.endswith("cannot import vllm: ModuleNotFoundError: No module named 'vllm'")
    assert installer.reports == []


@pytest_twisted.ensureDeferred
async def test_a_python_build_that_cannot_import_the_engine_is_broken_and_mended_at_a_recheck(tmp_path, make):
    python = python_with(tmp_path, "sglang", "0.5.1")
    clock = Clock()
    installer = make(clock)
    await installer.converge(EnginePlan([EngineBuild("vllm", python=python)]), set)
    entry = only(installer)
    assert (entry.state, entry.path) == (EngineState.BROKEN, python)
    assert entry.reason == f"{python} cannot import vllm: ModuleNotFoundError: No module named 'vllm'"
    (tmp_path / "site" / "vllm").mkdir()
    (tmp_path / "site" / "vllm" / "__init__.py").write_text("__version__ = '0.11.1'\n")
    clock.advance(600)
    await until(lambda: only(installer).state is EngineState.INSTALLED, "the recheck to find vllm")
    assert only(installer).version == "0.11.1"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest_twisted.ensureDeferred
async def test_a_command_past_its_timeout_is_killed_and_refused_saying_so(tmp_path):
    clock = Clock()
    pid_file = tmp_path / "pid"
    script = (f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
              "print('resolving dependencies', flush=True); time.sleep(120)")
    seen = []
    running = defer.ensureDeferred(run_bounded(reactor, clock, [sys.executable, "-c", script], timeout_s=5,
                                               on_output=seen.append))
    await until(lambda: seen, "the command to print something")
    pid = int(pid_file.read_text())
    clock.advance(5)
    with pytest.raises(Unusable) as refused:
        await running
    assert "did not finish within 5 s; it last said: resolving dependencies" in str(refused.value)
    await until(lambda: not alive(pid), "the command to be killed")
