"""The OS packages that provide the shared libraries an engine build lacks, named or installed.

An engine build from a release archive links against system libraries
(OpenMP, libcurl, OpenSSL, the Vulkan loader, OpenBLAS, libnuma…) that a
minimal node may not have.  The installer finds the missing ones with
``ldd``; this module says which package provides each, for apt-get (Debian,
Ubuntu) and dnf (RHEL, Fedora), as the sentence a refusal carries, or runs
the manager when server.yaml's ``engines.install_os_packages`` allows it
(the caller decides; nothing here asks).

The Debian names were checked with ``dpkg -S`` / ``apt-cache`` on Debian 12;
Ubuntu 24.04 renamed some for its 64-bit time_t move (libssl3t64,
libcurl4t64) and keeps the old names as what the new ones provide, which
apt-get resolves.  For dnf, a soname the table does not know is asked for by
the capability RPM gives every shared library (``libfoo.so.2()(64bit)``),
which dnf resolves itself; apt-get has no such thing, so there the sentence
says to install the package that provides it.
"""

from __future__ import annotations

import os
import shlex
import signal
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence

# soname -> (Debian/Ubuntu package, RHEL/Fedora package)
PACKAGES: dict[str, tuple[str, str | None]] = {
    "libgomp.so.1": ("libgomp1", "libgomp"),
    "libstdc++.so.6": ("libstdc++6", "libstdc++"),
    "libgcc_s.so.1": ("libgcc-s1", "libgcc"),
    "libgfortran.so.5": ("libgfortran5", "libgfortran"),
    "libcurl.so.4": ("libcurl4", "libcurl"),
    "libcurl-gnutls.so.4": ("libcurl3-gnutls", None),
    "libssl.so.3": ("libssl3", "openssl-libs"),
    "libcrypto.so.3": ("libssl3", "openssl-libs"),
    "libvulkan.so.1": ("libvulkan1", "vulkan-loader"),
    "libOpenCL.so.1": ("ocl-icd-libopencl1", "ocl-icd"),
    # Debian's libopenblas0 chooses one of its pthread/openmp/serial builds.
    "libopenblas.so.0": ("libopenblas0", "openblas"),
    "libz.so.1": ("zlib1g", "zlib"),
    "libzstd.so.1": ("libzstd1", "libzstd"),
    "liblzma.so.5": ("liblzma5", "xz-libs"),
    "libbz2.so.1.0": ("libbz2-1.0", "bzip2-libs"),
    "libbz2.so.1": ("libbz2-1.0", "bzip2-libs"),
    "libnuma.so.1": ("libnuma1", "numactl-libs"),
    "libffi.so.8": ("libffi8", "libffi"),
    "libxml2.so.2": ("libxml2", "libxml2"),
    "libc.so.6": ("libc6", "glibc"),
    "libm.so.6": ("libc6", "glibc"),
    "libdl.so.2": ("libc6", "glibc"),
    "libpthread.so.0": ("libc6", "glibc"),
    "librt.so.1": ("libc6", "glibc"),
}
MANAGERS = ("apt-get", "dnf")

# Libraries no package manager should be asked for: the driver's, and the
# CUDA runtime a build carries with it.
_NOT_A_PACKAGE = {
    "libcuda.so.1": "comes with the NVIDIA driver: install or repair the driver",
    "libnvidia-ml.so.1": "comes with the NVIDIA driver: install or repair the driver",
}
_CUDA_RUNTIME = ("libcudart.so", "libcublas.so", "libcublasLt.so")

# What is kept of a manager's output, from the end: enough for apt's last error.
_OUTPUT_TAIL = 64 * 1024

Run = Callable[..., "subprocess.CompletedProcess[bytes]"]
# How long a manager stopped at its timeout has to exit on SIGTERM (dpkg
# finishing the package it is on) before it is killed.
_GRACE_S = 15.0


class OSPackagesFailed(Exception):
    """The package manager did not install the packages; str() is the sentence, with its last output line."""


def package_manager() -> str | None:
    """"apt-get" or "dnf", whichever is on PATH (apt-get first); None when neither is."""
    return next((m for m in MANAGERS if shutil.which(m)), None)


def packages_for(sonames: Sequence[str], manager: str | None) -> dict[str, str | None]:
    """soname -> the package that provides it under *manager*; None: not known (or not a package's)."""
    return {soname: _package(soname, manager) for soname in sonames}


def _package(soname: str, manager: str | None) -> str | None:
    if soname in _NOT_A_PACKAGE or soname.startswith(_CUDA_RUNTIME):
        return None
    names = PACKAGES.get(soname)
    if manager == "apt-get":
        return names[0] if names else None
    if manager == "dnf":
        if names and names[1]:
            return names[1]
        # Every shared library in an RPM is a capability dnf can install by.
        return f"{soname}()(64bit)" if ".so" in soname else None
    return None


def advice(sonames: Sequence[str], manager: str | None) -> str:
    """The sentence placement and ``ctl show`` carry for a build missing *sonames*.

    "needs libgomp.so.1, which this node does not have: apt-get install libgomp1"
    """
    if not sonames:
        raise ValueError("advice() is for a build that lacks at least one library")
    wanted = list(dict.fromkeys(sonames))
    found = packages_for(wanted, manager)
    packages = list(dict.fromkeys(p for p in found.values() if p))
    steps = []
    if packages:
        assert manager is not None
        steps.append(f"{manager} install {shlex.join(packages)}")
    for soname in wanted:
        if found[soname] is not None:
            continue
        if soname in _NOT_A_PACKAGE:
            steps.append(f"{soname} {_NOT_A_PACKAGE[soname]}")
        elif soname.startswith(_CUDA_RUNTIME):
            steps.append(f"{soname} is the CUDA runtime, which the build must bring (llama.cpp: its cudart- archive)")
        elif manager is None and soname in PACKAGES:
            debian, rpm = PACKAGES[soname]
            steps.append(f"install the package that provides {soname} ({debian} on Debian and Ubuntu"
                         + (f", {rpm} on RHEL and Fedora)" if rpm else ")"))
        else:
            steps.append(f"install the package that provides {soname}")
    return f"needs {_and(wanted)}, which this node does not have: {'; '.join(steps)}"


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def run_stoppable(command: list[str], *, timeout: float, **kwargs) -> subprocess.CompletedProcess[bytes]:
    """subprocess.run, except that a timeout stops the whole process group, sudo's children too.

    subprocess.run kills only its child, and SIGKILL to sudo leaves the
    manager it started running as root; sudo passes SIGTERM on, so the group
    gets that first and SIGKILL only after a grace period.
    """
    with subprocess.Popen(command, start_new_session=True, **kwargs) as proc:
        try:
            return subprocess.CompletedProcess(command, proc.wait(timeout=timeout))
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=_GRACE_S)
            except subprocess.TimeoutExpired:
                _signal_group(proc.pid, signal.SIGKILL)
                proc.wait()
            raise


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        # Gone already, or root's (sudo's child): sudo itself passes SIGTERM on.
        pass


def install(packages: Sequence[str], manager: str, *, run: Run = run_stoppable, timeout_s: float = 900) -> str:
    """Install *packages* with *manager*, non-interactively; returns the command line it ran.

    Not root: through ``sudo -n`` (never a password prompt), so a site lets
    the agent's user run the manager in sudoers.  apt-get whose package lists
    do not know a package (a fresh container has none) runs ``apt-get update``
    and tries once more.  *timeout_s* bounds all of it; only the last 64 KiB
    of output is kept.  Raises OSPackagesFailed with the last output line.
    """
    if manager not in MANAGERS:
        raise ValueError(f"no way to install packages with {manager!r}: llmgw knows {', '.join(MANAGERS)}")
    if not packages or any(not p or p.startswith("-") for p in packages):
        raise ValueError(f"not a list of package names: {list(packages)!r}")
    sudo = ["sudo", "-n"] if os.geteuid() != 0 and shutil.which("sudo") else []
    deadline = time.monotonic() + timeout_s
    if manager == "apt-get":
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        command = [*sudo, "apt-get", "install", "-y", "--no-install-recommends",
                   "-o", "Dpkg::Options::=--force-confdef", "-o", "Dpkg::Options::=--force-confold", *packages]
        shown = "DEBIAN_FRONTEND=noninteractive " + shlex.join(command)
        code, tail = _run(command, env, run, deadline, timeout_s, shown)
        if code != 0 and ("Unable to locate package" in tail or "has no installation candidate" in tail):
            update = [*sudo, "apt-get", "update"]
            shown = f"{shlex.join(update)} && {shown}"
            code, tail = _run(update, env, run, deadline, timeout_s, shown)
            if code == 0:
                code, tail = _run(command, env, run, deadline, timeout_s, shown)
    else:
        command = [*sudo, "dnf", "install", "-y", *packages]
        shown = shlex.join(command)
        code, tail = _run(command, dict(os.environ), run, deadline, timeout_s, shown)
    if code != 0:
        last = _last_line(tail) or "no output"
        hint = ""
        if sudo and '"no new privileges" flag' in tail:
            # The hardened unit's NoNewPrivileges=: sudoers is not the cause, the unit is.
            hint = ("; the agent's unit forbids gaining privileges (NoNewPrivileges=), so install "
                    "contrib/llmgw-agent-os-packages.conf as its drop-in (docs/operations.rst), "
                    "or install the packages by hand")
        elif sudo and "sudo:" in last:
            hint = (f"; the agent is not root, so let its user run {manager} through sudo without a password, "
                    "or install the packages by hand")
        raise OSPackagesFailed(f"{shown} failed (exit status {code}): {last}{hint}")
    return shown


def _run(
    command: list[str], env: dict[str, str], run: Run, deadline: float, timeout_s: float, shown: str,
) -> tuple[int, str]:
    """(exit status, the tail of its output), stdin closed, stdout and stderr to a file read back in part."""
    left = deadline - time.monotonic()
    late = OSPackagesFailed(f"{shown} did not finish in {timeout_s:g} s and was stopped")
    if left <= 0:
        raise late
    with tempfile.TemporaryFile() as out:
        try:
            done = run(command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=left)
        except subprocess.TimeoutExpired as e:
            raise late from e
        except FileNotFoundError as e:
            raise OSPackagesFailed(f"{shown} could not start: {command[0]} is not on this node's PATH") from e
        size = out.seek(0, os.SEEK_END)
        out.seek(max(0, size - _OUTPUT_TAIL))
        return done.returncode, out.read().decode("utf-8", errors="replace")


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    # apt and dnf put the error first among their last lines, warnings after it.
    for line in reversed(lines):
        if line.startswith(("E:", "Error:", "sudo:")):
            return line
    return lines[-1] if lines else ""
