"""One agent per state directory: a lock held for the agent's life, naming its holder.

Two agents on one ``state_dir`` adopt each other's engines, stop what the
other started and rewrite each other's records; nothing in the records can
tell them apart.  So the agent takes ``<state_dir>/agent.lock`` with
``flock`` before it reads a record, and a second agent is refused with a
sentence naming the first.

``flock`` and not a pid file: the kernel releases the lock when the holder
dies, however it dies, so a stale file never keeps an agent from starting.
The file itself stays (removing it would let two agents lock two different
files of one name); what it says is read only while someone holds it.  The
descriptor is close-on-exec: an engine the agent starts outlives the agent
by design, and must not carry its lock.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

import attrs

from llmgw.agent import directories
from llmgw.errors import LlmgwError

LOCK_NAME = "agent.lock"
SEVERAL_AGENTS = "docs/operations.rst 'Several agents on one host'"


class StateDirInUse(LlmgwError):
    """Another agent holds this state directory; the message names it and what to do."""


class StateDirUnusable(LlmgwError):
    """The state directory cannot be created or opened by this user; the message says what to do."""


@attrs.frozen
class Holder:
    pid: int | None
    node_id: str | None

    def describe(self) -> str:
        if self.pid is None:
            return "another agent (it has not yet written its pid)"
        node = f" (node {self.node_id})" if self.node_id else ""
        return f"pid {self.pid}{node}"


class StateLock:
    """The held lock on one state directory; released by ``release()`` or by the process ending."""

    def __init__(self, path: Path, fd: int, node_id: str):
        self.path = path
        self.node_id = node_id
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, state_dir: str | os.PathLike[str], node_id: str) -> StateLock:
        """Lock *state_dir* for this process as *node_id*, or raise ``StateDirInUse`` naming the holder."""
        root = Path(state_dir)
        path = root / LOCK_NAME
        unmade = directories.make(root, "state_dir")
        if unmade is not None:
            raise StateDirUnusable(unmade)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            # Most often an agent started by a user who may not write the default /var/lib/llmgw.
            raise StateDirUnusable(
                f"cannot use state_dir {root}: {e.strerror.lower() if e.strerror else e}; set state_dir in "
                f"agent.yaml to a directory this user may write, or create this one for it "
                f"(install -d -o {directories.user()} {root})"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise StateDirInUse(
                f"state_dir {root} is in use by {holder.describe()}: give this agent its own state_dir, "
                f"node_id, weights_dirs and --pidfile; see {SEVERAL_AGENTS}"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        lock = cls(path, fd, node_id)
        lock.name_holder()
        return lock

    def name_holder(self) -> None:
        """Write this process's pid into the lock file: again after twistd forks into the background."""
        if self._fd is None:
            return
        data = json.dumps({"pid": os.getpid(), "node_id": self.node_id}).encode() + b"\n"
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the last descriptor releases the flock

    @property
    def held(self) -> bool:
        return self._fd is not None


def _read_holder(fd: int) -> Holder:
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"null")
    except (OSError, ValueError):
        data = None
    if not isinstance(data, dict):
        return Holder(None, None)
    pid, node_id = data.get("pid"), data.get("node_id")
    return Holder(pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
                  node_id if isinstance(node_id, str) else None)
