"""Running a command to learn about an engine: bounded in time and in what is read, its whole process group ended.

An engine's ``--version``, ``ldd`` on its binary, a Python importing it: the
agent runs these on files it downloaded or that agent.yaml names, so it
trusts none of them to be brief.  Each runs as the leader of a process group
of its own (``start_new_session``), with stdin closed and stdout and stderr
read together, and:

* at most ``max_output`` bytes are kept; a command that prints more is
  stopped there and refused (``--version`` printing 300 MB is not an engine);
* at ``timeout_s`` it is stopped and refused;
* however it ends, whatever is left of its group (a child that forked away
  and still holds the output open) is killed with it.

Blocking: call these from a thread.
"""

from __future__ import annotations

import os
import re
import select
import shlex
import signal
import subprocess
import time
from typing import Sequence

import attrs

# What an engine's probe prints is a few lines; 1 MiB is plenty and bounded.
MAX_OUTPUT_BYTES = 1 << 20
_CHUNK = 64 * 1024
# How often the leader's exit is looked at where the kernel offers no pidfd.
_POLL_S = 0.05


class ProbeFailed(Exception):
    """A probe command did not run to a successful end; ``str()`` says why."""

    def __init__(self, reason: str, output: str = "", returncode: int | None = None):
        super().__init__(reason)
        self.output = output
        self.returncode = returncode


@attrs.frozen
class Captured:
    """How a bounded command ended: its exit status (None: it was stopped) and what it printed, both streams."""

    returncode: int | None
    output: str
    # Why it was stopped: "timeout" or "output"; None when it ended by itself.
    stopped: str | None = None


def capture(argv: Sequence[str], timeout_s: float, *, max_output: int = MAX_OUTPUT_BYTES) -> Captured:
    """Run *argv* in a process group of its own; OSError when it cannot be started."""
    proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    assert proc.stdout is not None
    try:
        data, stopped = _read(proc, proc.stdout.fileno(), time.monotonic() + timeout_s, max_output)
    finally:
        # Before the leader is reaped its pid cannot be reused: the group is still its own.
        _kill_group(proc.pid)
        proc.stdout.close()
        proc.wait()
    return Captured(None if stopped else proc.returncode, data.decode("utf-8", "replace"), stopped)


def _read(proc: subprocess.Popen, fd: int, deadline: float, limit: int) -> tuple[bytes, str | None]:
    """What *proc* prints until it exits (and its output is drained), the deadline, or more than *limit* bytes."""
    data = bytearray()
    exited = _exit_watch(proc.pid)
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return bytes(data), "timeout"
            watch = [fd] + ([exited] if exited is not None else [])
            ready, _, _ = select.select(watch, [], [], left if exited is not None else min(left, _POLL_S))
            if fd in ready:
                chunk = os.read(fd, _CHUNK)
                if not chunk:
                    return bytes(data), None if _wait(proc, deadline) else "timeout"
                data += chunk
                if len(data) > limit:
                    return bytes(data[:limit]), "output"
                continue
            if (exited is not None and exited in ready) or (exited is None and _ended(proc)):
                # The leader is done; a child of it may hold the output open for ever: read what is there.
                while select.select([fd], [], [], 0)[0] and (chunk := os.read(fd, _CHUNK)):
                    data += chunk
                    if len(data) > limit:
                        return bytes(data[:limit]), "output"
                return bytes(data), None
    finally:
        if exited is not None:
            os.close(exited)


def _exit_watch(pid: int) -> int | None:
    """A descriptor readable once *pid* exits (Linux's pidfd), or None where there is none."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _ended(proc: subprocess.Popen) -> bool:
    """Whether *proc* has exited, without reaping it where the OS allows (so its group stays its own)."""
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except AttributeError:  # no waitid (macOS)
        return proc.poll() is not None
    except ChildProcessError:
        return True


def _wait(proc: subprocess.Popen, deadline: float) -> bool:
    """Whether *proc* exits before *deadline* (its output closed, it may still be finishing)."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if _ended(proc):
            return True
        time.sleep(min(left, _POLL_S))


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_probe(argv: Sequence[str], timeout_s: float, *, max_output: int = MAX_OUTPUT_BYTES) -> str:
    """Run *argv*; its stdout and stderr together when it exits 0, else ``ProbeFailed`` saying why."""
    command = shlex.join(argv)
    try:
        done = capture(argv, timeout_s, max_output=max_output)
    except OSError as e:
        raise ProbeFailed(f"{argv[0]} could not be run: {e.strerror or e}") from None
    if done.stopped == "timeout":
        raise ProbeFailed(f"{command} did not finish within {timeout_s:g} s", done.output)
    if done.stopped == "output":
        raise ProbeFailed(f"{command} printed more than {_size(max_output)} and was stopped: an engine's probe "
                          f"prints a few lines; check that {argv[0]} is the engine", done.output[-4096:])
    if done.returncode != 0:
        last = last_line(done.output)
        raise ProbeFailed(f"{command} exited with status {done.returncode}" + (f": {last}" if last else ""),
                          done.output, done.returncode)
    return done.output


def last_line(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return lines[-1] if lines else ""


_NOT_FOUND = re.compile(r"^\s*(\S+)\s*=>\s*not found", re.MULTILINE)
_LOADER_ERROR = re.compile(r"error while loading shared libraries: ([^:\s]+)")


def missing_libraries(binary: str, output: str = "", timeout_s: float = 10.0) -> list[str]:
    """Shared libraries *binary* needs and this node lacks.

    ``ldd`` names every one; the dynamic loader's own message in *output* names
    the first, which is all there is when ldd is absent or the file is a script.
    """
    missing: list[str] = []
    try:
        done = capture(["ldd", binary], timeout_s)
        missing = _NOT_FOUND.findall(done.output) if done.stopped != "timeout" else []
    except OSError:
        pass
    for name in _LOADER_ERROR.findall(output):
        if name not in missing:
            missing.append(name)
    return missing


def _size(n: int) -> str:
    return f"{n // 2**20} MiB" if n >= 2**20 and n % 2**20 == 0 else f"{n} bytes"
