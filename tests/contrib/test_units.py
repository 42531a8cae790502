"""contrib/'s systemd units, as systemd itself reads and rates them.

They once ran with none of systemd's sandboxing (``systemd-analyze security``
rated both 9.2, "UNSAFE"), though the docs said nothing was written outside
/var/lib.  Each is now held to a ceiling, rated by the real
``systemd-analyze``, and read by ``systemd-analyze verify`` with its paths
filled in.  What a unit leaves out because the process needs it (the
agent's GPUs, /tmp, a syscall filter; MemoryDenyWriteExecute= everywhere)
is said in docs/operations.rst, and where a reason can be shown on this
machine, a test shows it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONTRIB = ROOT / "contrib"
# Kept out of a llmgw-agent.service.d/ here: systemd-analyze would read it into the unit beside it.
DROP_IN = CONTRIB / "llmgw-agent-os-packages.conf"

# The exposure systemd-analyze may rate each unit at, at most (0 is sealed, 10 is open).
CEILINGS = {
    "llmgw-server.service": 1.5,
    "llmgw-router.service": 1.5,
    "llmgw-agent.service": 2.5,
}
# The agent with the drop-in that lets sudo install OS packages: still far from the 9.2 of none.
CEILING_WITH_OS_PACKAGES = 5.5


def units() -> list[Path]:
    return sorted(CONTRIB.glob("*.service"))


def with_drop_in(unit: Path, drop_in: Path, into: Path) -> Path:
    """*unit* with *drop_in*'s [Service] lines after its own, as systemd applies a drop-in, written to *into*."""
    text, extra = unit.read_text(), drop_in.read_text().split("[Service]\n", 1)[1]
    service, rest = text.split("\n[Install]\n", 1)
    into.write_text(f"{service}\n{extra}\n[Install]\n{rest}")
    return into


def exposure(systemd_analyze: str, unit: Path) -> float:
    done = subprocess.run([systemd_analyze, "security", "--offline=true", "--no-pager", str(unit)],
                          capture_output=True, text=True, timeout=60)
    rating = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", done.stdout)
    assert rating is not None, done.stdout + done.stderr
    return float(rating.group(1))


def test_every_unit_has_a_ceiling() -> None:
    assert {u.name for u in units()} == set(CEILINGS)


@pytest.mark.systemd
@pytest.mark.parametrize("unit", units(), ids=lambda p: p.name)
def test_systemd_rates_each_unit_under_its_ceiling(systemd_analyze: str, unit: Path) -> None:
    assert exposure(systemd_analyze, unit) <= CEILINGS[unit.name]


@pytest.mark.systemd
def test_the_os_packages_drop_in_gives_back_only_what_sudo_and_the_package_manager_need(
    systemd_analyze: str, tmp_path: Path
) -> None:
    agent = Path(shutil.copy(CONTRIB / "llmgw-agent.service", tmp_path / "alone.service"))
    loosened = with_drop_in(agent, DROP_IN, tmp_path / "llmgw-agent.service")
    assert exposure(systemd_analyze, agent) < exposure(systemd_analyze, loosened) <= CEILING_WITH_OS_PACKAGES
    settings = [line.split("=", 1)[0] for line in DROP_IN.read_text().splitlines() if "=" in line and line[0] != "#"]
    assert settings == ["NoNewPrivileges", "RestrictSUIDSGID", "CapabilityBoundingSet", "ProtectSystem"]


@pytest.mark.systemd
def test_the_rating_can_fail(systemd_analyze: str, tmp_path: Path) -> None:
    """The units as they were, with no hardening: the ceiling check refuses them."""
    bare = tmp_path / "llmgw-agent.service"
    bare.write_text("[Service]\nUser=llmgw\nExecStart=/opt/llmgw/bin/twistd -n llmgw-agent\n")
    assert exposure(systemd_analyze, bare) > 9


@pytest.mark.systemd
@pytest.mark.parametrize("unit", units(), ids=lambda p: p.name)
def test_systemd_reads_each_unit_without_a_complaint(systemd_analyze: str, unit: Path, tmp_path: Path) -> None:
    # verify looks for ExecStart='s program: a venv's twistd at the unit's prefix, as Install makes it.
    prefix = tmp_path / "opt"
    (prefix / "bin").mkdir(parents=True)
    shutil.copy("/bin/true", prefix / "bin" / "twistd")
    for case, text in (("plain", unit.read_text()), ("with the drop-in", None)):
        if text is None:
            if unit.name != "llmgw-agent.service":
                continue
            text = with_drop_in(unit, DROP_IN, tmp_path / "merged").read_text()
        filled = tmp_path / unit.name
        filled.write_text(text.replace("/opt/llmgw", str(prefix)).replace("User=llmgw", "User=root")
                          .replace("Group=llmgw", "Group=root"))
        done = subprocess.run([systemd_analyze, "verify", str(filled)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and done.stderr.strip() == "", f"{case}: {done.stderr}"


def test_nothing_in_the_agents_unit_lists_devices() -> None:
    """One device allowed by name shuts out the rest, the GPUs and InfiniBand adapters with them.

    ProtectClock= is one of these on an older systemd (it adds DeviceAllow=char-rtc r), which GPU
    nodes still run (Ubuntu 22.04 has 249).
    """
    settings = {line.split("=", 1)[0] for line in (CONTRIB / "llmgw-agent.service").read_text().splitlines()
                if "=" in line and not line.startswith("#")}
    assert settings & {"PrivateDevices", "DeviceAllow", "DevicePolicy", "ProtectClock"} == set()


@pytest.mark.parametrize("unit", units(), ids=lambda p: p.name)
def test_no_unit_forbids_memory_that_is_written_then_run(unit: Path) -> None:
    """MemoryDenyWriteExecute= would stop the TLS every process does (next test), and engines' JITs."""
    assert "MemoryDenyWriteExecute" not in unit.read_text()


# prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN): what systemd sets for MemoryDenyWriteExecute=yes.
DENY_WRITE_EXECUTE = "import ctypes; raise SystemExit(ctypes.CDLL(None).prctl(65, 1, 0, 0, 0) != 0)"
HUB_TLS = """
import ctypes, sys
if sys.argv[1] == "deny":
    if ctypes.CDLL(None).prctl(65, 1, 0, 0, 0) != 0:
        raise SystemExit(3)
from OpenSSL import SSL
from llmgw.link.tls import server_options
from llmgw.tlsfiles import TLSFiles
pki = sys.argv[2]
hub = server_options(TLSFiles(f"{pki}/ca.crt", f"{pki}/llmgw-server.crt", f"{pki}/llmgw-server.key"))
# What HubTLS.serverConnectionForTLS does for each connection: Python callbacks on it.
connection = SSL.Connection(hub._options.getContext(), None)
connection.set_verify(SSL.VERIFY_PEER | SSL.VERIFY_FAIL_IF_NO_PEER_CERT, lambda *checked: True)
connection.set_info_callback(lambda *state: None)
"""


def _kernel_has_mdwe() -> bool:
    # PR_SET_MDWE came with Linux 6.3; asked in a child, which it would bind for good.
    return subprocess.run([sys.executable, "-c", DENY_WRITE_EXECUTE], timeout=60).returncode == 0


@pytest.mark.skipif(not sys.platform.startswith("linux") or not _kernel_has_mdwe(),
                    reason="the kernel has no PR_SET_MDWE (Linux 6.3), which MemoryDenyWriteExecute= is")
def test_the_hubs_tls_cannot_run_where_written_memory_may_not_be_run(pki: Path) -> None:
    """What MemoryDenyWriteExecute= asks of a process, through the kernel's own switch for it.

    The hub checks each handshake in Python (pyOpenSSL's verify and info
    callbacks), and cffi makes each callback a trampoline in memory written
    and then executed: refused there, no agent could connect.
    """
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    allowed = subprocess.run([sys.executable, "-c", HUB_TLS, "allow", str(pki)], capture_output=True, text=True,
                             timeout=60, env=env)
    assert allowed.returncode == 0, allowed.stderr
    denied = subprocess.run([sys.executable, "-c", HUB_TLS, "deny", str(pki)], capture_output=True, text=True,
                            timeout=60, env=env)
    assert denied.returncode == 1 and "Cannot allocate write+execute memory" in denied.stderr, denied.stderr
