"""The files of a download on disk: a local source checked, a finished file recognised,
a ``.partial`` opened and locked so that one process at a time writes it."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from pathlib import Path

from twisted.logger import Logger

from .errors import FetchError, SizeMismatch

log = Logger()


def check_local(path: Path) -> Path:
    """*path* when it is weights an engine can open (a non-empty file or directory); FetchError naming it if not."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise FetchError(f"{path} does not exist on this node; copy the weights there, "
                         "or give a URL as the model's source") from None
    except OSError as e:
        raise FetchError(f"{path}: {e.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        # vLLM and SGLang load a directory of files.
        try:
            with os.scandir(path) as entries:
                if any(True for _ in entries):
                    return path
        except OSError as e:
            raise FetchError(f"{path}: {e.strerror}") from None
        raise FetchError(f"{path} is an empty directory on this node; put the model's files there")
    if not stat.S_ISREG(st.st_mode):
        raise FetchError(f"{path} is not a regular file")
    if st.st_size == 0:
        raise FetchError(f"{path} is empty (0 bytes) on this node; an interrupted copy looks like this, copy it again")
    return path


def finished(final: Path, expected_size: int | None) -> bool:
    """True when a verified download already sits at *final*; FetchError when something else is in its way."""
    try:
        st = os.lstat(final)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
        raise FetchError(f"{final} is in the way of a download and is not a non-empty regular file; remove it")
    if expected_size is not None and st.st_size != expected_size:
        raise SizeMismatch(f"{final} holds {st.st_size} bytes, expected {expected_size}; "
                           "remove it (llmgw ctl weights --collect, once no model wants it) to fetch it again")
    return True


def lock_partial(partial: Path):
    """The partial file opened and locked for writing, or None while another process holds it."""
    while True:
        try:
            fd = os.open(partial, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise FetchError(f"{partial} is a symbolic link; llmgw never writes through one, remove it") from None
            raise FetchError(f"cannot write {partial}: {e.strerror}") from None
        held = _lock(fd, partial)
        if held is None:
            return None
        if held:
            return os.fdopen(fd, "r+b")


def _lock(fd: int, path: Path) -> bool | None:
    """Lock *fd*, opened at *path*: True when it is ours; None (and *fd* closed) while another
    process holds it; False (closed too) when *path* is not the file opened any more."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    # The holder before us may have renamed or deleted what we opened: then
    # ours is not the one at that name any more, and the caller starts over.
    try:
        same = os.fstat(fd).st_ino == os.lstat(path).st_ino
    except FileNotFoundError:
        same = False
    if not same:
        os.close(fd)
    return same


def make_directory(path: Path) -> None:
    """*path* as a directory, made if need be; FetchError when it cannot be."""
    try:
        os.mkdir(path, 0o755)
    except FileExistsError:
        pass
    except OSError as e:
        raise FetchError(f"cannot create {path}: {e.strerror}") from None


def finished_directory(final: Path) -> bool:
    """True when a fetched repository sits at *final*; FetchError when something else is in its way."""
    try:
        st = os.lstat(final)
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        raise FetchError(f"{final} is in the way of a repository's download and is not a directory; remove it")
    return True


def lock_directory(staging: Path) -> int | None:
    """The staging directory, made if need be, opened and locked: its descriptor, or None while another holds it."""
    while True:
        make_directory(staging)
        try:
            fd = os.open(staging, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            continue  # its holder renamed it into place a moment ago
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                raise FetchError(f"{staging} is not a directory llmgw made (a link or a file); remove it") from None
            raise FetchError(f"cannot open {staging}: {e.strerror}") from None
        held = _lock(fd, staging)
        if held is None:
            return None
        if held:
            return fd


def release_partial(locked, partial: Path) -> None:
    """Close (and so unlock) the partial file, removing it when nothing was written to resume."""
    try:
        try:
            locked.flush()
            if os.fstat(locked.fileno()).st_size == 0:
                partial.unlink(missing_ok=True)
        finally:
            locked.close()
    except OSError as e:
        log.info("closing {partial}: {error}", partial=partial, error=e.strerror)
