"""The TUI's tests, which run in a pytest process of their own:

    python -m pytest tests/tui -p no:twisted

pytest-twisted installs Twisted's default reactor when pytest starts, and a
process keeps its first reactor for good; the dashboard needs Twisted's
asyncio reactor on the event loop Textual runs on (here pytest-asyncio's
session loop, see the ``reactor`` fixture).  So where another reactor is
already installed — the suite's ordinary run, ``pytest tests`` — this
directory is left out of collection, quietly; the Makefile runs it as a
second pytest invocation.  Asked for on its own with that reactor
(``pytest tests/tui``), the run stops and prints the command above.

Every async test here uses the session's loop (``pytestmark`` in each
module), because the reactor is bound to one loop.  The real-process tests
start servers and agents as tests/integration does, with the ``cluster``
fixture of tests/support/cluster.py.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
import pytest_asyncio

from tests.support.cluster import cluster  # noqa: F401 - a fixture

COMMAND = "python -m pytest tests/tui -p no:twisted"


def _reactor_taken() -> bool:
    if "twisted.internet.reactor" not in sys.modules:
        return False
    from twisted.internet import reactor
    from twisted.internet.asyncioreactor import AsyncioSelectorReactor

    return not isinstance(reactor, AsyncioSelectorReactor)


def _asked_for_only_these(config) -> bool:
    here = Path(__file__).resolve().parent
    paths = [Path(config.invocation_params.dir, arg.split("::")[0]).resolve() for arg in config.args]
    return bool(paths) and all(p == here or here in p.parents for p in paths)


def pytest_ignore_collect(collection_path, config):
    if not _reactor_taken():
        return None
    if _asked_for_only_these(config):
        pytest.exit(f"the TUI tests need a pytest process without pytest-twisted's reactor: {COMMAND}",
                    returncode=pytest.ExitCode.USAGE_ERROR)
    return True


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def reactor():
    """Twisted's asyncio reactor on the session's loop, running (so its thread pool resolves names)."""
    from llmgw.tui.backend import install_reactor

    reactor = install_reactor(asyncio.get_running_loop())
    if not reactor.running:
        reactor.startRunning(installSignalHandlers=False)
    yield reactor
    if reactor.threadpool is not None:
        reactor.threadpool.stop()
