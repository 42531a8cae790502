"""Engine processes as the operating system sees them: groups, identities, signals.

Everything here is a thin, blocking call into the kernel or /proc; nothing
waits. The supervisor decides when to call it.

An engine is launched through a few lines of Python (``LAUNCHER``) that call
``setsid()`` and then exec the engine, so the engine leads a session and a
process group of its own: signalling the group reaches every process the
engine forks (vLLM's workers, a shell's children), and nothing the agent's
own group receives (a Ctrl-C in a terminal, systemd stopping the agent)
reaches the engine. ``reactor.spawnProcess`` has no ``preexec_fn``, and
util-linux's ``setsid(1)`` is not on every node, while the Python running the
agent always is.

Every engine also carries environment variables naming the agent's state
directory, its shard and its run (a token also written in its record), which
every process it forks inherits. They are how an agent recognises, after a
restart, a process that it started but that no record describes, and how it
finds a worker that left its engine's process group.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from pathlib import Path

import attrs
import psutil

# Exec the engine as the leader of a new session; if it cannot be run, say so
# on stderr (which is the shard's log) and exit 127, as a shell would.
LAUNCHER = (
    "import os, sys\n"
    "os.setsid()\n"
    "try:\n"
    "    os.execvp(sys.argv[1], sys.argv[1:])\n"
    "except OSError as e:\n"
    "    sys.stderr.write('llmgw: cannot run %s: %s\\n' % (sys.argv[1], e.strerror or e))\n"
    "    sys.stderr.flush()\n"
    "    os._exit(127)\n"
)

MARK_STATE_DIR = "LLMGW_AGENT_STATE_DIR"
MARK_SHARD = "LLMGW_SHARD_ID"
MARK_RUN = "LLMGW_SHARD_RUN"

# psutil derives create_time from clock ticks since boot; the same process
# reads back the same value, and a recycled pid differs by far more.
CREATE_TIME_TOLERANCE_S = 0.05


def launcher_argv(argv: list[str]) -> list[str]:
    """The argv that runs *argv* in a new session (``-I -S``: nothing of the
    agent's PYTHONPATH or site-packages is loaded into the launcher)."""
    if not argv:
        raise ValueError("a launch plan needs at least the engine's executable")
    return [sys.executable, "-I", "-S", "-c", LAUNCHER, *argv]


def marker_env(state_dir: Path, shard_id: str, run: str) -> dict[str, str]:
    return {MARK_STATE_DIR: str(state_dir), MARK_SHARD: shard_id, MARK_RUN: run}


@attrs.frozen
class ProcessIdentity:
    """A process as a pid *and* the moment it began, so a recycled pid is not ours."""

    pid: int
    create_time: float


def identify(pid: int) -> ProcessIdentity | None:
    try:
        return ProcessIdentity(pid, psutil.Process(pid).create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def is_alive(identity: ProcessIdentity) -> bool:
    """The very process *identity* names still runs (a zombie has finished)."""
    try:
        proc = psutil.Process(identity.pid)
        if abs(proc.create_time() - identity.create_time) > CREATE_TIME_TOLERANCE_S:
            return False
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        # Someone else's process under our pid: not the one we started.
        return False


def signal_group(pgid: int, sig: int, *, leader: int | None = None) -> bool:
    """Send *sig* to process group *pgid*; False when the group is empty.

    Right after spawning, the launcher may not have called setsid() yet, so
    the group does not exist while its leader-to-be does: then the leader
    alone is signalled. Our own group is never signalled.
    """
    if pgid <= 1 or pgid == os.getpgrp():
        raise ValueError(f"refusing to signal process group {pgid}: it is not an engine's")
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        pass
    except PermissionError:
        return False
    if leader is not None and leader > 1 and leader != os.getpid():
        try:
            os.kill(leader, sig)
            return True
        except (ProcessLookupError, PermissionError):
            return False
    return False


def group_alive(pgid: int) -> bool:
    """Some process of group *pgid* still runs (zombies waiting for a parent
    that will never reap them do not count)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                return True
        except (OSError, psutil.Error):
            continue
    return False


@attrs.frozen
class MarkedProcess:
    pid: int
    pgid: int
    shard_id: str | None
    run: str | None
    cmdline: str


def marked_processes(state_dir: Path) -> list[MarkedProcess]:
    """Every live process carrying the marker of an agent on *state_dir*,
    except this process and its group."""
    own_pid, own_group = os.getpid(), os.getpgrp()
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid == own_pid or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            env = proc.environ()
            if env.get(MARK_STATE_DIR) != str(state_dir):
                continue
            pgid = os.getpgid(proc.pid)
            if pgid == own_group:
                continue
            found.append(MarkedProcess(proc.pid, pgid, env.get(MARK_SHARD), env.get(MARK_RUN),
                                       " ".join(proc.cmdline())[:200]))
        except (OSError, psutil.Error):
            continue
    return found


def kill_run(state_dir: Path, run: str) -> list[int]:
    """SIGKILL every process left of one run of an engine, wherever its group;
    the pids signalled."""
    killed = []
    for proc in marked_processes(state_dir):
        if proc.run == run:
            try:
                os.kill(proc.pid, signal.SIGKILL)
                killed.append(proc.pid)
            except OSError:
                pass
    return killed


def describe_exit(exit_code: int | None, sig: int | None) -> str:
    if sig:
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return f"killed by signal {sig} ({name})"
    if exit_code is not None:
        return f"exited with code {exit_code}"
    return "exited"


def group_connected(pgid: int, host: str, port: int) -> bool:
    """Some process of group *pgid* holds an established TCP connection to *host*:*port* (blocking).

    How a worker rank is seen to have joined rank 0: torch.distributed's
    store and Ray's GCS keep their clients connected for as long as they run.
    """
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)}
    except OSError:
        return False
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) != pgid:
                continue
            for conn in proc.net_connections("tcp"):
                # A socket of both families reports an IPv4 peer as ::ffff:a.b.c.d.
                if conn.status == psutil.CONN_ESTABLISHED and conn.raddr and conn.raddr.port == port \
                        and conn.raddr.ip.removeprefix("::ffff:") in addresses:
                    return True
        except (OSError, psutil.Error):
            continue
    return False
