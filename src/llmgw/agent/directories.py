"""The directories agent.yaml names: made at start when missing, and what keeps one from use, in words.

An agent onboarded with ``--weights-dir /srv/weights`` had that directory in
agent.yaml and nowhere else: nothing made it, discovery skips a directory
that does not exist (as it does an unmounted filer), and the node showed no
disk without saying why.  Now the agent makes its ``state_dir`` and every
``weights_dirs`` entry at start, missing parents too, mode 0750 and owned by
the user it runs as; what it cannot make, or cannot use, is one sentence in
its log and in the warnings the node registers with.

Under systemd the agent's unit sees the system read-only except where it may
write (``ReadWritePaths=``), so a directory elsewhere fails with "read-only
file system" though its permissions allow it: a sentence says which it is
and what to change.
"""

from __future__ import annotations

import errno
import os
import shlex

MODE = 0o750
UNIT = "llmgw-agent"
UNITS_DOC = "docs/operations.rst 'What the units allow'"


def user() -> str:
    """The name of the user this process runs as (its uid where it has none)."""
    import pwd

    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def under_systemd() -> bool:
    """Whether systemd started this process as a service (it sets INVOCATION_ID for each)."""
    return bool(os.environ.get("INVOCATION_ID"))


def make(path: str | os.PathLike[str], what: str, *, writes: bool = True) -> str | None:
    """Make *path* and its missing parents, mode 0750; None when the agent can use it now, else why not.

    *what* names it as agent.yaml does ("state_dir", "weights dir"); *writes*
    as for ``problem``.  Only what this call creates gets the mode; an
    existing directory keeps its own.
    """
    path = os.path.abspath(path)
    missing = []
    step = path
    while not os.path.lexists(step):
        missing.append(step)
        parent = os.path.dirname(step)
        if parent == step:
            break
        step = parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, MODE)
            # mkdir's mode passes through the umask; 0750 is what is promised.
            os.chmod(directory, MODE)
        except FileExistsError:
            continue  # made meanwhile (two agents starting): used as it is
        except OSError as e:
            return _cannot_make(path, what, os.path.dirname(directory), e.errno)
    return problem(path, what, writes=writes)


def make_weights_dirs(weights_dirs: list[str] | tuple[str, ...]) -> list[str]:
    """``make`` each weights directory: the first is where fetched weights land, the rest are only read."""
    said = (make(path, "weights dir", writes=i == 0) for i, path in enumerate(dict.fromkeys(weights_dirs)))
    return [sentence for sentence in said if sentence is not None]


def weights_dir_problems(weights_dirs: list[str] | tuple[str, ...]) -> list[str]:
    """``problem`` for each weights directory, as ``make_weights_dirs`` would say it, changing nothing."""
    said = (problem(path, "weights dir", writes=i == 0) for i, path in enumerate(dict.fromkeys(weights_dirs)))
    return [sentence for sentence in said if sentence is not None]


def problem(path: str | os.PathLike[str], what: str, *, writes: bool) -> str | None:
    """What keeps the agent from using *path* now, in words; None when nothing does.

    Changes nothing: a missing directory is said as ``make`` would fail to
    make it.  *writes*: the agent writes there (its state, the weights it
    fetches), rather than only reading what an operator put there.
    """
    path = os.path.abspath(path)
    if not os.path.lexists(path):
        step = os.path.dirname(path)
        while not os.path.lexists(step):
            step = os.path.dirname(step)
        if not os.path.isdir(step):
            return _cannot_make(path, what, step, errno.ENOTDIR)
        if _read_only(step):
            return _cannot_make(path, what, step, errno.EROFS)
        if not os.access(step, os.W_OK | os.X_OK):
            return _cannot_make(path, what, step, errno.EACCES)
        return f"{what} {path} does not exist: the agent makes it when it starts; is its filesystem mounted?"
    if not os.path.isdir(path):
        return f"{what} {path} is not a directory: name a directory in agent.yaml, or move what is there"
    if not os.access(path, os.R_OK | os.X_OK):
        return (f"the agent (user {user()}) may not read {what} {path}: let it "
                f"({_quoted('chown', '-R', user(), path)}), or name another in agent.yaml")
    if writes and _read_only(path):
        return _read_only_sentence(f"{what} {path} cannot be written", path, exists=True)
    if writes and not os.access(path, os.W_OK | os.X_OK):
        return (f"the agent (user {user()}) may not write to {what} {path}: let it "
                f"({_quoted('chown', user(), path)}), or name another in agent.yaml")
    return None


def _read_only(path: str) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _cannot_make(path: str, what: str, parent: str, code: int | None) -> str:
    said = f"{what} {path} does not exist and the agent cannot make it"
    if code == errno.EROFS:
        return _read_only_sentence(said, path, exists=False)
    if code in (errno.EACCES, errno.EPERM):
        return (f"{said}: user {user()} may not write to {parent}; make it for the agent "
                f"({_quoted('install', '-d', '-o', user(), '-m', '0750', path)}), or name another in agent.yaml")
    if code == errno.ENOTDIR:
        return f"{said}: {parent} is not a directory; name another in agent.yaml"
    return f"{said}: {os.strerror(code).lower() if code else 'unknown error'}"


def _read_only_sentence(said: str, path: str, *, exists: bool) -> str:
    if under_systemd():
        # systemd binds ReadWritePaths= when the unit starts: only a directory there then, and a restart.
        make = "" if exists else f"make the directory ({_quoted('install', '-d', '-o', user(), '-m', '0750', path)}), "
        return (f"{said}: its systemd unit may write only where ReadWritePaths= says; {make}add it there "
                f"(`systemctl edit {UNIT}`: [Service] ReadWritePaths={_unit_path(path)}) unless the unit names it "
                f"already, and restart the agent ({UNITS_DOC})")
    return f"{said}: the filesystem is read-only; name a directory on a writable one in agent.yaml"


def _quoted(*argv: str) -> str:
    return shlex.join(argv)


def _unit_path(path: str) -> str:
    """*path* as a unit's ReadWritePaths= reads it: '%' doubled, quoted where it holds space or quotes."""
    path = path.replace("%", "%%")
    if any(c.isspace() or c in "\"'\\" for c in path):
        return '"' + path.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return path
