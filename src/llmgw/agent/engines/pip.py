"""vLLM and SGLang on a node: a ``python:`` probed where it is, a ``pip:`` installed into a venv of the node's own.

A Python engine is usable when its interpreter imports the package and the
package says its ``__version__``: that is the probe, for a site's own
environment and for a venv the node built.  The venv is built with
``python -m venv`` (no system site-packages, so nothing of the agent's own
interpreter shows through) and filled with ``pip install --no-input``; both
run as child processes of the reactor, with a timeout, their output kept to
its last ``OUTPUT_TAIL`` bytes, and the number of bytes pip has printed
reported as the install's progress, since pip says no total a node could
trust.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import signal
import sys
from pathlib import Path
from typing import Callable, Sequence

from twisted.internet import defer, error, protocol, task
from twisted.logger import Logger

from llmgw.agent.procs import launcher_argv, signal_group
from llmgw.engines.base import ProbeFailed, last_line, run_probe
from llmgw.records import EngineBuild, Progress

from .layout import Unusable

log = Logger()

# The module each Python engine's package is imported as.
MODULES = {"vllm": "vllm", "sglang": "sglang"}
OUTPUT_TAIL = 64 * 1024
# What the agent's own environment must not lend a child Python.
_PYTHON_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "PYTHONUSERBASE")


def venv_key(build: EngineBuild) -> str:
    """The folder name of *build*'s venv: another spec, index or version is another venv."""
    text = "\0".join((build.pip or "", build.index_url or "", build.version or ""))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def probe(python: str, name: str, timeout_s: float) -> str:
    """The version of engine *name* that *python* imports (blocking: call from a thread); Unusable if none."""
    module = MODULES[name]
    # -c puts the agent's working directory first on sys.path: a folder named
    # vllm there would be imported instead of the interpreter's own.
    script = f"import sys; sys.path[:] = [p for p in sys.path if p not in ('', '.')]; " \
             f"import {module}; print({module}.__version__)"
    try:
        output = run_probe([python, "-c", script], timeout_s)
    except ProbeFailed as e:
        said = last_line(e.output) if e.returncode is not None else ""
        raise Unusable(f"{python} cannot import {module}: {said or e}") from None
    version = last_line(output)
    if not version:
        raise Unusable(f"{python}: {module}.__version__ is empty")
    return version


def check_version(build: EngineBuild, python: str, version: str) -> None:
    """Unusable when server.yaml names a version of *build* and *python* has another."""
    if build.version is not None and version != build.version:
        raise Unusable(f"{python} has {build.name} {version}, and engines.{build.name}.version in server.yaml "
                      f"says {build.version}")


def child_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in _PYTHON_ENV}


async def install_venv(reactor, clock, directory: Path, build: EngineBuild, *, python: str,
                       progress: Callable[[Progress], object], venv_timeout_s: float, pip_timeout_s: float,
                       progress_interval_s: float) -> str:
    """Make a venv at *directory* and ``pip install`` *build*'s spec into it; the venv's python.

    Progress goes out as for a download, keyed ``pip:SPEC``: about once
    every *progress_interval_s* of *clock* while pip runs, and a final one.
    """
    spec = build.pip or ""
    env = child_env()
    await run_bounded(reactor, clock, [python, "-m", "venv", str(directory)], timeout_s=venv_timeout_s, env=env)
    index = ["--index-url", build.index_url] if build.index_url else []
    argv = [str(directory / "bin" / "pip"), "install", "--no-input", "--disable-pip-version-check", *index, spec]
    seen = [0]

    def report(final: bool = False, error: str | None = None) -> None:
        try:
            progress(Progress(source=f"pip:{spec}", file_name=spec, bytes_done=seen[0], final=final, error=error))
        except Exception:
            log.failure("progress callback failed for pip:{spec}", spec=spec)

    ticker = task.LoopingCall(report)
    ticker.clock = clock
    ticker.start(progress_interval_s, now=False)
    try:
        await run_bounded(reactor, clock, argv, timeout_s=pip_timeout_s, env=env,
                          on_output=lambda n: seen.__setitem__(0, n))
    except Unusable as e:
        report(final=True, error=str(e))
        raise
    finally:
        if ticker.running:
            ticker.stop()
    report(final=True)
    return str(directory / "bin" / "python")


class _Collect(protocol.ProcessProtocol):
    def __init__(self, on_output: Callable[[int], object] | None):
        self.on_output = on_output
        self.tail = bytearray()
        self.seen = 0
        self.ended: defer.Deferred = defer.Deferred()
        self.reason: BaseException | None = None
        self.on_exit: Callable[[], object] | None = None

    def connectionMade(self) -> None:
        self.transport.closeStdin()

    def childDataReceived(self, childFD: int, data: bytes) -> None:
        self.seen += len(data)
        self.tail += data
        del self.tail[:-OUTPUT_TAIL]
        if self.on_output is not None:
            self.on_output(self.seen)

    def processExited(self, reason) -> None:
        # A child left in its group may hold the output open, and processEnded waits for that.
        if self.on_exit is not None:
            self.on_exit()

    def processEnded(self, reason) -> None:
        self.reason = reason.value
        self.ended.callback(None)


async def run_bounded(reactor, clock, argv: Sequence[str], *, timeout_s: float, env: dict[str, str] | None = None,
                      on_output: Callable[[int], object] | None = None) -> str:
    """Run *argv* with stdin closed; the tail of its output when it exits 0, else Unusable saying why.

    It runs as the leader of a process group of its own (see
    :mod:`llmgw.agent.procs`): at *timeout_s* of *clock*, when cancelled, and
    once it has ended, the whole group is killed (pip's build backends, a
    child that forked away), without waiting on children that may still hold
    its output open; Unusable says which.
    """
    command = shlex.join(argv)
    collect = _Collect(on_output)
    try:
        transport = reactor.spawnProcess(collect, sys.executable, launcher_argv(list(argv)),
                                         env=env if env is not None else child_env())
    except OSError as e:
        raise Unusable(f"{argv[0]} could not be run: {e.strerror or e}") from None
    pid = transport.pid
    collect.on_exit = lambda: _kill(transport, pid)
    done: defer.Deferred = defer.Deferred()  # True: it ended; False: the timeout came first
    collect.ended.addCallback(lambda _: done.called or done.callback(True))
    timer = clock.callLater(timeout_s, lambda: done.called or done.callback(False))
    try:
        ended_in_time = await done
    finally:
        if timer.active():
            timer.cancel()
        _kill(transport, pid)  # the group: what it left behind, or all of it when stopped
    output = collect.tail.decode("utf-8", "replace")
    if not ended_in_time:
        said = last_line(output)
        raise Unusable(f"{command} did not finish within {timeout_s:g} s" + (f"; it last said: {said}" if said else ""))
    ended = collect.reason
    if isinstance(ended, error.ProcessDone):
        return output
    code = getattr(ended, "exitCode", None)
    how = f"exited with status {code}" if code is not None else f"was killed by signal {ended.signal}"
    said = last_line(output)
    raise Unusable(f"{command} {how}" + (f": {said}" if said else ""))


def _kill(transport, pid: int) -> None:
    """SIGKILL to the command's process group; to the command itself too while it may not have called setsid yet."""
    running = transport.pid is not None  # None once Twisted reaped it: its pid may be another's now
    try:
        signal_group(pid, signal.SIGKILL, leader=pid if running else None)
    except ValueError:
        pass
