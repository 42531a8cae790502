"""On the node: whether it is a machine llmgw's agent can run on, and whether an agent still runs there.

Sent over ssh with :mod:`llmgw.ctl.nodeside`, as the module ``llmgw_nodehost``
(the standard library only, as nodeside is).  ``check`` asks
:func:`host_problems` before anything is changed; ``remove`` asks
:func:`agent_running`, stops the engines the agent recorded (:func:`stop_engines`), and asks
:func:`running_from` before it removes the venv.

systemd is the node's init when ``/run/systemd/system`` is a directory: the
test ``sd_booted()`` makes, which holds in a container or WSL whose PID 1 is
not systemd only if it really is.  The one override is explicit:
:data:`SYSTEMD_DIR_ENV` in the ssh session's environment names the
directory that stands for it (llmgw's tests point it at one they make, on a
machine whose PID 1 is not systemd, with a stand-in ``systemctl``).
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import shutil
import signal
import time

SYSTEMD_DIR = "/run/systemd/system"
# Read from the node's environment; docs/onboarding.rst, "What check refuses".
SYSTEMD_DIR_ENV = "LLMGW_NODE_SYSTEMD_DIR"
# The state directory's filesystem: the agent's records and logs, before any weights (which have their own dirs).
MIN_STATE_FREE_MB = 100
# The agent's state lock (llmgw.agent.statelock), read here without importing llmgw.
LOCK_NAME = "agent.lock"
# Offboarding: each engine's process group is given this long after SIGTERM, then as long again after SIGKILL.
ENGINE_STOP_S = 10.0
# At most this many of the state directory's shard records are read, each at most this big.
MAX_RECORDS, MAX_RECORD_BYTES = 4096, 1 << 20
# The agent's (psutil's) create_time and the one read here come from the same /proc figures.
CREATE_TIME_TOLERANCE_S = 0.05


def systemd_dir() -> str:
    return os.environ.get(SYSTEMD_DIR_ENV) or SYSTEMD_DIR


def host_problems(request: dict) -> list[str]:
    """One sentence for each thing the node lacks that the agent or onboarding needs (besides paths and the hub)."""
    problems = []
    booted = systemd_dir()
    if not os.path.isdir(booted):
        init = _comm(1)
        problems.append(f"this node's init is not systemd (PID 1 is {init or 'unknown'}, and there is no {booted}, "
                        "as there is on a machine systemd booted): llmgw's agent runs as a systemd unit, so "
                        "onboard a machine or VM that systemd boots (in a container or WSL, enable systemd "
                        "there first), or install the agent by hand (docs/operations.rst)")
    elif shutil.which("systemctl") is None:
        problems.append("there is no systemctl on PATH, though systemd booted this node; put it on root's PATH")
    prefix = request["prefix"]
    if not os.path.exists(os.path.join(prefix, "bin", "python")):
        lacking = [m for m in ("venv", "ensurepip") if importlib.util.find_spec(m) is None]
        if lacking:
            problems.append(f"this node's Python has no {' or '.join(lacking)} module, so it cannot make the venv "
                            f"at {prefix}: install python3-venv (Debian, Ubuntu) or name another Python with "
                            "--python")
    return problems


def unreachable(user: str, paths: list[tuple[str, str]]) -> list[str]:
    """One sentence per path whose way down *user* (the agent's) may not pass: a directory it cannot search (x)."""
    import pwd
    import shlex
    import stat

    entry = pwd.getpwnam(user)
    if entry.pw_uid == 0:
        return []
    groups = set(os.getgrouplist(user, entry.pw_gid))
    blocked = {}  # the first directory the user may not pass: what it keeps the user from
    for key, path in paths:
        # Every directory above it; the path itself too where onboarding does not give it to the agent.
        way = os.path.abspath(path) if key in ("prefix", "config_dir") else os.path.dirname(os.path.abspath(path))
        while not os.path.exists(way):
            way = os.path.dirname(way)
        chain = [way]
        while chain[-1] != "/":
            chain.append(os.path.dirname(chain[-1]))
        for directory in reversed(chain):
            try:
                st = os.stat(directory)
            except OSError:
                break
            bit = (stat.S_IXUSR if st.st_uid == entry.pw_uid else
                   stat.S_IXGRP if st.st_gid in groups else stat.S_IXOTH)
            if stat.S_ISDIR(st.st_mode) and not st.st_mode & bit:
                blocked.setdefault((directory, st), []).append(f"{path} (--{key.replace('_', '-')})")
                break
    return [f"the agent's user {user} cannot pass {directory} (mode {stat.S_IMODE(st.st_mode):04o}, uid {st.st_uid}, "
            f"gid {st.st_gid}) to reach {', '.join(what)}; let it (chmod o+x {shlex.quote(directory)}) or choose "
            "other paths" for (directory, st), what in blocked.items()]


def _comm(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
            return f.read(64).strip() or None
    except OSError:
        return None


def agent_running(state_dir: str, prefix: str) -> list[str]:
    """The running agent, each as ``pid N (how it was found)``: the holder of the state lock, and any twistd from the venv."""
    found = {}
    holder = _lock_holder(os.path.join(state_dir, LOCK_NAME))
    if holder is not None:  # -1: held by a process that has not written its pid yet
        found[holder] = f"it holds {os.path.join(state_dir, LOCK_NAME)}"
    twistd = os.path.join(prefix, "bin", "twistd")
    for pid, argv in _processes():
        if twistd in argv[:2] and pid not in found:
            found[pid] = f"it runs {twistd}"
    return [f"{'a process' if pid == -1 else f'pid {pid}'} ({how})" for pid, how in sorted(found.items())]


def running_from(prefix: str) -> list[str]:
    """Every process that runs a program from the venv at *prefix*, as ``pid N (PROGRAM)``."""
    inside = os.path.join(os.path.abspath(prefix), "")
    real = os.path.join(os.path.realpath(prefix), "")
    found = []
    for pid, argv in _processes():
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            exe = ""
        ran = [a for a in argv[:2] if a.startswith(inside)] + [exe] * exe.startswith(real)
        if ran:
            found.append(f"pid {pid} ({ran[0]})")
    return found


def _processes():
    """(pid, argv) of every process but this one and its parents' shell, read from /proc."""
    mine = {os.getpid(), os.getppid()}
    try:
        pids = [int(n) for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return
    for pid in pids:
        if pid in mine:
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read(1 << 16).split(b"\0") if a]
        except OSError:
            continue  # gone meanwhile
        if argv:
            yield pid, argv


def _lock_holder(path: str) -> int | None:
    """The pid the agent's state lock names while a process holds it; None when it is free or not there."""
    try:  # the agent's user owns the state dir: a link is not followed, a FIFO not waited on
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                pid = json.loads(os.read(fd, 4096)).get("pid")
            except (OSError, ValueError, AttributeError):
                pid = None
            return pid if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 else -1
        except OSError:
            return None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def stop_engines(state_dir: str, stop_s: float = ENGINE_STOP_S, owner: int | None = None) -> list[str]:
    """Kill the engine process groups the agent recorded in *state_dir*/shards, and wait (bounded) until they are gone.

    A group is killed only when its recorded leader is the very process the
    agent started (pid and start time), or when the leader has exited and
    its group still runs (a group id is not reused while its group lives);
    and, with *owner* (the agent's uid), only when every process in it is
    that user's: the agent's user writes the records, and offboarding runs
    as root, so a forged record must not name another user's group.
    What is left after SIGKILL and *stop_s* is a failure naming it.
    """
    groups = {}
    shards = os.path.join(state_dir, "shards")
    try:
        names = sorted(n for n in os.listdir(shards) if n.endswith(".json"))[:MAX_RECORDS]
    except OSError:
        return []
    for name in names:
        found = _engine_group(os.path.join(shards, name))
        if found is not None and (owner is None or _group_owned_by(found, owner)):
            groups[found] = name[:-len(".json")]
    if not groups:
        return []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pgid in groups:
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + stop_s
        while any(_group_alive(g) for g in groups) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not any(_group_alive(g) for g in groups):
            return [f"engine process group {g} (shard {shard})" for g, shard in groups.items()]
    left = [f"{g} (shard {shard})" for g, shard in groups.items() if _group_alive(g)]
    raise SystemExit(f"engine process groups {', '.join(left)} still run {2 * stop_s:.0f} s after SIGTERM and "
                     "SIGKILL; kill them by hand (kill -KILL -- -PGID) and run offboarding again")


def _engine_group(path: str) -> int | None:
    """The process group a shard record names, when it is the agent's engine and still runs; else None."""
    try:  # the agent's user writes these: a link is not followed, a FIFO not waited on
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK), "rb") as f:
            record = json.loads(f.read(MAX_RECORD_BYTES + 1)[:MAX_RECORD_BYTES])
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict):
        return None
    pid, pgid, started = record.get("pid"), record.get("pgid"), record.get("create_time")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 1 for v in (pid, pgid)) or \
            not isinstance(started, (int, float)) or isinstance(started, bool):
        return None
    if pgid == os.getpgrp() or pgid != pid:
        return None
    now = _create_time(pid)
    if now is not None:
        same = abs(now - started) <= CREATE_TIME_TOLERANCE_S and _pgid(pid) == pgid
        return pgid if same else None
    return pgid if _group_alive(pgid) else None


def _group_owned_by(pgid: int, uid: int) -> bool:
    """Whether every process of group *pgid* runs as *uid* (real and effective), as the agent's engines do."""
    for pid in (n for n in os.listdir("/proc") if n.isdigit()):
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[2] != str(pgid):
                    continue
            with open(f"/proc/{pid}/status") as f:
                uids = next(line.split()[1:3] for line in f if line.startswith("Uid:"))
        except (OSError, IndexError, StopIteration):
            continue  # gone meanwhile
        if uids != [str(uid), str(uid)]:
            return False
    return True


def _create_time(pid: int) -> float | None:
    """*pid*'s start, as psutil reckons it on Linux (boot time plus start ticks); None when it does not run."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
    except (OSError, IndexError, ValueError, StopIteration):
        return None
    if fields[0] == "Z":
        return None
    return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _group_alive(pgid: int) -> bool:
    """Whether a process of group *pgid* runs (a zombie, waiting for its parent to reap it, has finished)."""
    try:
        pids = [n for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        pids = None
    if pids is None:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            return True
    return False
