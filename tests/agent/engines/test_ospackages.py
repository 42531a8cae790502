"""ospackages: the package behind each missing library, the sentence that names it, and the install that runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmgw.agent.engines import ospackages
from llmgw.agent.engines.ospackages import OSPackagesFailed, advice, install, package_manager, packages_for
from tests.support.wait import wait_for

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="apt-get, dnf and /proc are Linux's")


def _executable(directory: Path, name: str, script: str = "#!/bin/sh\nexit 0\n") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(script)
    path.chmod(0o755)
    return path


@pytest.mark.parametrize("on_path, manager", [
    (["apt-get"], "apt-get"), (["dnf"], "dnf"), (["dnf", "apt-get"], "apt-get"), ([], None), (["yum"], None),
])
def test_package_manager_is_what_is_on_path(tmp_path, monkeypatch, on_path, manager):
    for name in on_path:
        _executable(tmp_path / "bin", name)
    (tmp_path / "bin").mkdir(exist_ok=True)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert package_manager() == manager


@pytest.mark.parametrize("soname, apt, dnf", [
    ("libgomp.so.1", "libgomp1", "libgomp"),
    ("libstdc++.so.6", "libstdc++6", "libstdc++"),
    ("libgcc_s.so.1", "libgcc-s1", "libgcc"),
    ("libcurl.so.4", "libcurl4", "libcurl"),
    ("libssl.so.3", "libssl3", "openssl-libs"),
    ("libcrypto.so.3", "libssl3", "openssl-libs"),
    ("libvulkan.so.1", "libvulkan1", "vulkan-loader"),
    ("libopenblas.so.0", "libopenblas0", "openblas"),
    ("libz.so.1", "zlib1g", "zlib"),
    ("libzstd.so.1", "libzstd1", "libzstd"),
    ("libnuma.so.1", "libnuma1", "numactl-libs"),
    # Unknown: apt-get has no way to ask by library; dnf asks by RPM's capability.
    ("libfoo.so.2", None, "libfoo.so.2()(64bit)"),
    # The driver's and the CUDA runtime are no OS package's.
    ("libcuda.so.1", None, None),
    ("libcudart.so.12", None, None),
])
def test_the_package_that_provides_each_library(soname, apt, dnf):
    assert packages_for([soname], "apt-get") == {soname: apt}
    assert packages_for([soname], "dnf") == {soname: dnf}
    assert packages_for([soname], None) == {soname: None}


@pytest.mark.parametrize("sonames, manager, sentence", [
    (["libgomp.so.1"], "apt-get", "needs libgomp.so.1, which this node does not have: apt-get install libgomp1"),
    (["libgomp.so.1"], "dnf", "needs libgomp.so.1, which this node does not have: dnf install libgomp"),
    (["libssl.so.3", "libcrypto.so.3", "libgomp.so.1"], "apt-get",
     "needs libssl.so.3, libcrypto.so.3 and libgomp.so.1, which this node does not have: "
     "apt-get install libssl3 libgomp1"),
    (["libgomp.so.1", "libgomp.so.1"], "apt-get",
     "needs libgomp.so.1, which this node does not have: apt-get install libgomp1"),
    (["libfoo.so.2"], "apt-get",
     "needs libfoo.so.2, which this node does not have: install the package that provides libfoo.so.2"),
    (["libgomp.so.1", "libfoo.so.2"], "apt-get",
     "needs libgomp.so.1 and libfoo.so.2, which this node does not have: apt-get install libgomp1; "
     "install the package that provides libfoo.so.2"),
    (["libfoo.so.2"], "dnf",
     "needs libfoo.so.2, which this node does not have: dnf install 'libfoo.so.2()(64bit)'"),
    (["libgomp.so.1"], None,
     "needs libgomp.so.1, which this node does not have: install the package that provides libgomp.so.1 "
     "(libgomp1 on Debian and Ubuntu, libgomp on RHEL and Fedora)"),
    (["libcurl-gnutls.so.4"], None,
     "needs libcurl-gnutls.so.4, which this node does not have: install the package that provides "
     "libcurl-gnutls.so.4 (libcurl3-gnutls on Debian and Ubuntu)"),
    (["libfoo.so.2"], None,
     "needs libfoo.so.2, which this node does not have: install the package that provides libfoo.so.2"),
    (["libcuda.so.1"], "apt-get",
     "needs libcuda.so.1, which this node does not have: libcuda.so.1 comes with the NVIDIA driver: "
     "install or repair the driver"),
    (["libcublas.so.12", "libgomp.so.1"], "apt-get",
     "needs libcublas.so.12 and libgomp.so.1, which this node does not have: apt-get install libgomp1; "
     "libcublas.so.12 is the CUDA runtime, which the build must bring (llama.cpp: its cudart- archive)"),
])
def test_advice(sonames, manager, sentence):
    assert advice(sonames, manager) == sentence


def test_advice_is_for_something_missing():
    with pytest.raises(ValueError):
        advice([], "apt-get")


# -- install ------------------------------------------------------------------

class FakeRun:
    """subprocess.run's seam: records each call and answers with the next (exit status, output)."""

    def __init__(self, *answers: tuple[int, bytes] | BaseException) -> None:
        self.answers = list(answers)
        self.calls: list[tuple[list[str], dict]] = []

    def __call__(self, command, **kwargs):
        self.calls.append((command, kwargs))
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        code, output = answer
        kwargs["stdout"].write(output)
        return subprocess.CompletedProcess(command, code)


@pytest.fixture
def as_root(monkeypatch):
    monkeypatch.setattr(ospackages.os, "geteuid", lambda: 0)


APT = ["apt-get", "install", "-y", "--no-install-recommends",
       "-o", "Dpkg::Options::=--force-confdef", "-o", "Dpkg::Options::=--force-confold"]
APT_SHOWN = ("DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "
             "-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold")


def test_apt_get_runs_without_asking_anything_and_says_what_it_ran(as_root):
    run = FakeRun((0, b"Setting up libgomp1 (12.2.0-14) ...\n"))
    assert install(["libgomp1", "libcurl4"], "apt-get", run=run, timeout_s=60) == f"{APT_SHOWN} libgomp1 libcurl4"
    [(command, kwargs)] = run.calls
    assert command == APT + ["libgomp1", "libcurl4"]
    assert kwargs["env"]["DEBIAN_FRONTEND"] == "noninteractive"
    assert kwargs["stdin"] is subprocess.DEVNULL and kwargs["stderr"] is subprocess.STDOUT
    assert 0 < kwargs["timeout"] <= 60


def test_dnf_runs_with_yes(as_root):
    run = FakeRun((0, b"Complete!\n"))
    shown = install(["libgomp", "libfoo.so.2()(64bit)"], "dnf", run=run)
    assert shown == "dnf install -y libgomp 'libfoo.so.2()(64bit)'"
    assert run.calls[0][0] == ["dnf", "install", "-y", "libgomp", "libfoo.so.2()(64bit)"]


def test_a_failed_install_says_the_error_line_of_its_output(as_root):
    output = b"Reading package lists...\nE: Could not get lock /var/lib/dpkg/lock-frontend\nW: a warning after it\n"
    with pytest.raises(OSPackagesFailed) as caught:
        install(["libgomp1"], "apt-get", run=FakeRun((100, output)))
    assert str(caught.value) == (
        f"{APT_SHOWN} libgomp1 failed (exit status 100): E: Could not get lock /var/lib/dpkg/lock-frontend"
    )


def test_apt_lists_that_do_not_know_the_package_are_updated_once(as_root):
    run = FakeRun((100, b"E: Unable to locate package libgomp1\n"), (0, b"Reading package lists... Done\n"), (0, b""))
    shown = install(["libgomp1"], "apt-get", run=run)
    assert shown == f"apt-get update && {APT_SHOWN} libgomp1"
    assert [c for c, _ in run.calls] == [APT + ["libgomp1"], ["apt-get", "update"], APT + ["libgomp1"]]


def test_a_package_still_unknown_after_the_update_fails_in_its_own_words(as_root):
    unknown = b"E: Unable to locate package libnope\n"
    run = FakeRun((100, unknown), (0, b""), (100, unknown))
    with pytest.raises(OSPackagesFailed, match=r"failed \(exit status 100\): E: Unable to locate package libnope$"):
        install(["libnope"], "apt-get", run=run)
    assert len(run.calls) == 3


def test_an_install_that_runs_past_its_timeout_is_stopped(as_root):
    run = FakeRun(subprocess.TimeoutExpired(["dnf"], 5.0))
    with pytest.raises(OSPackagesFailed) as caught:
        install(["libgomp"], "dnf", run=run, timeout_s=5)
    assert str(caught.value) == "dnf install -y libgomp did not finish in 5 s and was stopped"


def test_a_manager_that_is_not_there(as_root):
    with pytest.raises(OSPackagesFailed) as caught:
        install(["libgomp"], "dnf", run=FakeRun(FileNotFoundError(2, "No such file", "dnf")))
    assert str(caught.value) == "dnf install -y libgomp could not start: dnf is not on this node's PATH"


def test_not_root_goes_through_sudo_that_never_prompts(monkeypatch):
    monkeypatch.setattr(ospackages.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(ospackages.shutil, "which", lambda name: f"/usr/bin/{name}")
    run = FakeRun((1, b"sudo: a password is required\n"))
    with pytest.raises(OSPackagesFailed) as caught:
        install(["libgomp"], "dnf", run=run)
    assert run.calls[0][0][:3] == ["sudo", "-n", "dnf"]
    assert str(caught.value) == (
        "sudo -n dnf install -y libgomp failed (exit status 1): sudo: a password is required; the agent is not "
        "root, so let its user run dnf through sudo without a password, or install the packages by hand"
    )


@pytest.mark.parametrize("packages, manager", [([], "apt-get"), (["-o", "x"], "apt-get"), (["x"], "pacman")])
def test_install_refuses_what_it_cannot_run_safely(packages, manager):
    with pytest.raises(ValueError):
        install(packages, manager, run=FakeRun())


def test_only_the_end_of_a_long_output_is_read(as_root):
    output = b"Unpacking ...\n" * 200_000 + b"E: Sub-process /usr/bin/dpkg returned an error code (1)\n"
    with pytest.raises(OSPackagesFailed, match=r"E: Sub-process /usr/bin/dpkg returned an error code \(1\)$"):
        install(["libgomp1"], "apt-get", run=FakeRun((100, output)))


def test_the_real_run_hands_the_manager_a_noninteractive_environment(tmp_path, monkeypatch, as_root):
    seen = tmp_path / "seen"
    _executable(tmp_path / "bin", "apt-get", f'#!/bin/sh\necho "$DEBIAN_FRONTEND $*" > {seen}\n')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    install(["libgomp1"], "apt-get", timeout_s=30)
    assert seen.read_text() == "noninteractive " + " ".join(APT[1:] + ["libgomp1"]) + "\n"


def test_a_timeout_stops_the_managers_children_too(tmp_path, monkeypatch):
    monkeypatch.setattr(ospackages, "_GRACE_S", 2.0)
    pidfile = tmp_path / "child"
    # sh waits on a child of its own: stopping sh alone would leave the child running.
    script = f"sleep 60 & echo $! > {pidfile}; wait"
    with pytest.raises(subprocess.TimeoutExpired):
        ospackages.run_stoppable(["sh", "-c", script], timeout=1.0,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    child = int(pidfile.read_text())
    wait_for(lambda: not _running(child), 10, "the manager's child to end with it")


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_under_the_hardened_unit_sudo_refusing_names_the_drop_in_not_sudoers(monkeypatch):
    # sudo's own words when the process may not gain privileges (the unit's
    # NoNewPrivileges=): sudoers is not what to change, the unit's drop-in is.
    monkeypatch.setattr(ospackages.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(ospackages.shutil, "which", lambda name: f"/usr/bin/{name}")
    run = FakeRun((1, b'sudo: The "no new privileges" flag is set, which prevents sudo from running as root.\n'
                      b"sudo: If sudo is running in a container, you may need to adjust the container "
                      b"configuration to disable the flag.\n"))
    with pytest.raises(OSPackagesFailed) as caught:
        install(["libgomp"], "dnf", run=run)
    assert "install contrib/llmgw-agent-os-packages.conf as its drop-in" in str(caught.value)
    assert "sudoers" not in str(caught.value) and "without a password" not in str(caught.value)
