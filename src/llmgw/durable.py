"""Writing a file whole or not at all, and durably: what the CA's keys and a shard's record need.

A reader — another process, or this one after a crash — sees the old file
or the new one, never half of either: the bytes go to a temporary file
beside the target, are fsynced, and only then take the target's name, and
the directory is fsynced so the rename survives a power cut.  A private file
is created 0600 by the ``open()`` that creates it, so no byte of it is ever
readable by others, whatever the umask; a public one is 0644.  Without
``replace`` an existing file is never overwritten, even by a writer racing
this one.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from pathlib import Path

# Filesystems that cannot make a hard link say one of these.
_NO_LINKS = (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK)


def write_file(path: str | os.PathLike[str], data: bytes, *, private: bool, replace: bool) -> None:
    """Put *data* at *path* whole, or leave *path* as it was and raise ``OSError``.

    Without *replace*, an existing *path* raises ``FileExistsError`` and stays
    as it was.  The temporary file (``.NAME.RANDOM.tmp``, hidden) is gone
    when this returns or raises.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(tmp, flags, 0o600)
    try:
        try:
            if not private:
                os.fchmod(fd, 0o644)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        _publish(tmp, path, replace=replace)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    _sync_directory(path.parent)


def _publish(tmp: Path, path: Path, *, replace: bool) -> None:
    if replace:
        os.replace(tmp, path)
        return
    # link() fails if `path` exists, which makes "never overwrite" hold even
    # against another writer at the same moment.
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise
    except OSError as e:
        if e.errno not in _NO_LINKS:
            raise
        # A filesystem without hard links: the check just before has to do.
        if os.path.lexists(path):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(path)) from None
        os.rename(tmp, path)


def _sync_directory(directory: Path) -> None:
    """fsync *directory*, so the names created or renamed in it are durable; best effort."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
