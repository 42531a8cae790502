"""Writing a file whole or not at all: what pki's keys and the agent's shard records rely on."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from llmgw.durable import write_file

needs_proc = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to name a descriptor")


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _listing(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.mark.parametrize("umask", [0o000, 0o077])
def test_private_files_are_0600_and_public_ones_0644_whatever_the_umask(tmp_path: Path, umask: int) -> None:
    old = os.umask(umask)
    try:
        write_file(tmp_path / "secret", b"s", private=True, replace=False)
        write_file(tmp_path / "public", b"p", private=False, replace=False)
    finally:
        os.umask(old)
    assert (_mode(tmp_path / "secret"), _mode(tmp_path / "public")) == (0o600, 0o644)
    assert _listing(tmp_path) == {"public": b"p", "secret": b"s"}


@needs_proc
def test_no_byte_of_a_private_file_is_written_where_others_could_read_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    modes: list[int] = []
    real_write = os.write

    def spy(fd: int, data) -> int:
        modes.append(stat.S_IMODE(os.fstat(fd).st_mode))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", spy)
    old = os.umask(0)  # so 0600 can only come from the open itself
    try:
        write_file(tmp_path / "secret", b"key material", private=True, replace=False)
    finally:
        os.umask(old)
    assert modes and set(modes) == {0o600}


def test_an_existing_file_is_never_overwritten_without_replace(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"theirs")
    with pytest.raises(FileExistsError):
        write_file(tmp_path / "f", b"ours", private=True, replace=False)
    assert _listing(tmp_path) == {"f": b"theirs"}


def test_a_file_that_appears_while_writing_is_not_overwritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_fsync = os.fsync

    def racing_fsync(fd: int) -> None:
        real_fsync(fd)
        if not (tmp_path / "f").exists():
            (tmp_path / "f").write_bytes(b"theirs")

    monkeypatch.setattr(os, "fsync", racing_fsync)
    with pytest.raises(FileExistsError):
        write_file(tmp_path / "f", b"ours", private=True, replace=False)
    assert _listing(tmp_path) == {"f": b"theirs"}


def test_replace_puts_the_new_bytes_in_place(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"old")
    write_file(tmp_path / "f", b"new", private=True, replace=True)
    assert _listing(tmp_path) == {"f": b"new"}
    assert _mode(tmp_path / "f") == 0o600


@needs_proc
@pytest.mark.parametrize("replace", [False, True])
def test_a_write_that_fails_halfway_leaves_the_old_file_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, replace: bool
) -> None:
    if replace:
        (tmp_path / "f").write_bytes(b"old")
    before = _listing(tmp_path)
    real_write = os.write

    def disk_full(fd: int, data) -> int:
        if ".f." in os.readlink(f"/proc/self/fd/{fd}"):
            real_write(fd, bytes(data[:3]))
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", disk_full)
    with pytest.raises(OSError, match="No space left"):
        write_file(tmp_path / "f", b"0123456789", private=True, replace=replace)
    monkeypatch.undo()
    assert _listing(tmp_path) == before


def test_short_writes_are_continued_until_every_byte_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, bytes(data[:2])))
    write_file(tmp_path / "f", b"a record of some length", private=True, replace=True)
    monkeypatch.undo()
    assert _listing(tmp_path) == {"f": b"a record of some length"}


@pytest.mark.parametrize("err", [errno.EPERM, errno.EXDEV, errno.EOPNOTSUPP])
def test_without_hard_links_it_renames_and_still_refuses_an_existing_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, err: int
) -> None:
    def no_links(src, dst, *a, **kw):
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(os, "link", no_links)
    write_file(tmp_path / "f", b"ours", private=False, replace=False)
    assert _listing(tmp_path) == {"f": b"ours"}
    with pytest.raises(FileExistsError):
        write_file(tmp_path / "f", b"again", private=False, replace=False)
    assert _listing(tmp_path) == {"f": b"ours"}
