"""Unpack an engine's release archive without letting it write anywhere but its own new directory.

This is the boundary between a file fetched from the internet and the node's
disk, so it trusts nothing the archive says: every member's name, type, link
target and size is checked here, before it is written, and each refusal is
one sentence naming the member.  Python's ``tarfile.data_filter`` is asked
too, as a second line, never as the only one (zip has no such filter).

What is refused: absolute names; a ``..`` component; devices, fifos and
sockets; a symlink whose target, read from the link's own directory and
through the links already written, lands outside the directory; a hardlink
(tar) whose target is not a file already unpacked; a name that repeats an
earlier member (a directory as a file, a file as a directory, anything
twice but a directory) or writes through a symlink written earlier; more
members or more bytes than the limits (counted as declared and as actually
written, since a zip bomb lies about its sizes); an archive that is corrupt
or cut short.  On any refusal, or any other error, the directory is removed
entirely: nothing half-unpacked is ever left to be mistaken for an install.

Files keep only their executable bit (0755 or 0644, never setuid); hardlinks
become copies; ownership and times are not restored.  A zip stores a symlink
as a member whose Unix mode (``external_attr >> 16``) says S_IFLNK and whose
content is the target; llama.cpp's archives carry ``libllama.so ->
libllama.so.0`` chains, so those are made as links.
"""

from __future__ import annotations

import lzma
import os
import re
import shutil
import stat
import struct
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

_CHUNK = 1 << 20
# A symlink's target is a path; anything longer is not one.
_MAX_LINK = 4096
# What a damaged archive makes tarfile, zipfile and the decompressors raise
# (zipfile: NotImplementedError for an unknown compression, RuntimeError for
# an encrypted member); caught only around reads, never around writes.
_READ_ERRORS = (
    tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error, lzma.LZMAError, OSError,
    struct.error, ValueError, NotImplementedError, RuntimeError,
)


class UnsafeArchive(Exception):
    """An archive that is not unpacked; the message is one sentence naming the member and why."""


def extract(
    archive: Path, dest: Path, *, max_bytes: int = 8 * 2**30, max_members: int = 20_000,
) -> list[str]:
    """Unpack a .tar.gz/.tar.xz/.tar.bz2/.tar/.zip (told apart by content, not name) into *dest*.

    *dest* is created and must not exist.  Returns the member names written,
    relative to *dest*.  Raises UnsafeArchive for anything refused (see the
    module), after removing *dest*.
    """
    archive = Path(archive)
    dest = Path(dest)
    if os.path.lexists(dest):
        raise FileExistsError(f"{dest} already exists: an archive is unpacked only into a new directory")
    kind = _kind(archive)
    dest.mkdir(parents=False)
    try:
        unpacker = _Unpacker(archive.name, dest, max_bytes=max_bytes, max_members=max_members)
        if kind == "zip":
            _unpack_zip(archive, unpacker)
        else:
            _unpack_tar(archive, kind, unpacker)
        unpacker.check_links()
        return list(unpacker.written)
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise


def _kind(archive: Path) -> str:
    try:
        with archive.open("rb") as f:
            head = f.read(512)
    except OSError as e:
        raise UnsafeArchive(f"{archive.name} cannot be read: {e.strerror or e}") from e
    if head.startswith(b"\x1f\x8b"):
        return "gz"
    if head.startswith(b"\xfd7zXZ\x00"):
        return "xz"
    if head.startswith(b"BZh"):
        return "bz2"
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        return "zip"
    if head[257:262] == b"ustar" or _old_tar_header(head):
        return "tar"
    what = "it is empty" if not head else f"it starts with {head[:8].hex(' ')}, which is neither tar nor zip"
    raise UnsafeArchive(f"{archive.name} is not a complete archive: {what}")


def _old_tar_header(head: bytes) -> bool:
    # A pre-POSIX (v7) tar has no magic; its header checksum is the only sign.
    if len(head) < 512:
        return False
    try:
        return tarfile.nti(head[148:156]) in tarfile.calc_chksums(head)
    except tarfile.HeaderError:
        return False


@contextmanager
def _reading(archive_name: str) -> Iterator[None]:
    """Turn whatever a damaged archive makes the decompressors raise into one sentence."""
    try:
        yield
    except UnsafeArchive:
        raise
    except _READ_ERRORS as e:
        raise UnsafeArchive(f"{archive_name} is not a complete archive: {e}") from e


class _Unpacker:
    """Checks each member against what is already on disk under *dest*, then writes it."""

    def __init__(self, archive_name: str, dest: Path, *, max_bytes: int, max_members: int) -> None:
        self.archive_name = archive_name
        self.dest = dest
        self.root = os.path.realpath(dest)
        self.max_bytes = max_bytes
        self.max_members = max_members
        self.members = 0
        self.declared = 0
        self.bytes_written = 0
        # Insertion-ordered set: a directory may be named again, harmlessly.
        self.written: dict[str, None] = {}
        self.links: list[str] = []
        # A second opinion asked just before each write (tar: Python's data_filter).
        self.second_line: Callable[[], None] | None = None

    def refuse(self, name: str, why: str) -> UnsafeArchive:
        return UnsafeArchive(f"{self.archive_name}: member {name!r} {why}")

    # -- names ---------------------------------------------------------------

    def parts(self, name: str) -> list[str]:
        """*name*'s components below dest, '.' and empty ones dropped; refuses what is not below dest."""
        if "\x00" in name:
            raise self.refuse(name, "has a NUL character in its name")
        if name.startswith(("/", "\\")) or re.match(r"[A-Za-z]:", name):
            raise self.refuse(name, "is an absolute path: an engine archive unpacks only below its own directory")
        # A backslash is a separator to Windows tools that made some zips, so
        # '..\\' climbs there; refused as such rather than written as a name.
        if ".." in re.split(r"[/\\]", name):
            raise self.refuse(name, "has a '..' component: unpacking it would write outside its directory")
        return [p for p in name.split("/") if p not in ("", ".")]

    def count(self, name: str, declared: int) -> None:
        self.members += 1
        if self.members > self.max_members:
            raise UnsafeArchive(
                f"{self.archive_name} holds more than {self.max_members} members (at {name!r}): "
                "that is not an engine build"
            )
        self.declared += max(declared, 0)
        if self.declared > self.max_bytes:
            raise self._too_big(name)

    def _too_big(self, name: str) -> UnsafeArchive:
        return UnsafeArchive(
            f"{self.archive_name} unpacks to more than {_size(self.max_bytes)} (at {name!r}): "
            "that is not an engine build"
        )

    def place(self, name: str, parts: list[str], *, is_dir: bool = False) -> str | None:
        """The path to write *parts* at, its parents made as real directories; None: the directory exists."""
        path = self.root
        for i, part in enumerate(parts):
            path = os.path.join(path, part)
            here = "/".join(parts[: i + 1])
            last = i == len(parts) - 1
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                if last:
                    return path
                os.mkdir(path, 0o755)
                continue
            if stat.S_ISLNK(st.st_mode):
                if last:
                    raise self.refuse(name, f"repeats {here!r}, a symlink written earlier")
                raise self.refuse(name, f"writes through the symlink {here!r} written earlier")
            if not stat.S_ISDIR(st.st_mode):
                if last:
                    raise self.refuse(name, f"repeats {here!r}, a file written earlier")
                raise self.refuse(name, f"repeats {here!r}, a file, as a directory")
            if last:
                if is_dir:
                    return None
                raise self.refuse(name, f"repeats the directory {here!r} as a file")
        return None

    def vetted(self, name: str) -> None:
        if self.second_line is None:
            return
        try:
            self.second_line()
        except tarfile.FilterError as e:
            # Reached only when a member passed every check here: then the
            # stricter of the two wins, and says so.
            raise self.refuse(name, f"is refused by Python's tar data filter: {e}") from e

    def inside(self, path: str) -> bool:
        return os.path.commonpath([self.root, path]) == self.root

    # -- writing -------------------------------------------------------------

    def directory(self, name: str) -> None:
        parts = self.parts(name)
        if not parts:
            return
        path = self.place(name, parts, is_dir=True)
        self.vetted(name)
        if path is not None:
            os.mkdir(path, 0o755)
        self.written["/".join(parts)] = None

    def file(self, name: str, source: IO[bytes], *, executable: bool) -> None:
        parts = self.parts(name)
        if not parts:
            raise self.refuse(name, "is a file with no name")
        path = self.place(name, parts)
        assert path is not None
        self.vetted(name)
        # O_EXCL|O_NOFOLLOW: should a check above ever miss, the write fails
        # rather than follows a link or replaces what is there.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o755 if executable else 0o644)
        with os.fdopen(fd, "wb") as out:
            while True:
                with _reading(self.archive_name):
                    chunk = source.read(_CHUNK)
                if not chunk:
                    break
                self.bytes_written += len(chunk)
                if self.bytes_written > self.max_bytes:
                    raise self._too_big(name)
                out.write(chunk)
        self.written["/".join(parts)] = None

    def symlink(self, name: str, target: str) -> None:
        parts = self.parts(name)
        if not parts:
            raise self.refuse(name, "is a symlink with no name")
        if not target or "\x00" in target:
            raise self.refuse(name, "is a symlink with an empty or unreadable target")
        if target.startswith("/"):
            raise self.refuse(name, f"is a symlink to the absolute path {target!r}, outside its directory")
        path = self.place(name, parts)
        assert path is not None
        if not self.inside(os.path.realpath(os.path.join(os.path.dirname(path), target))):
            raise self.refuse(name, f"is a symlink to {target!r}, which lands outside its directory")
        self.vetted(name)
        os.symlink(target, path)
        self.links.append(name)
        self.written["/".join(parts)] = None

    def hardlink(self, name: str, target: str) -> None:
        """A tar hardlink names an earlier member from the archive's top; it is written as a copy."""
        parts = self.parts(name)
        if not parts:
            raise self.refuse(name, "is a hardlink with no name")
        if not target or target.startswith("/") or ".." in target.split("/"):
            raise self.refuse(name, f"is a hardlink to {target!r}, outside its directory")
        source = os.path.realpath(os.path.join(self.root, target))
        if not self.inside(source):
            raise self.refuse(name, f"is a hardlink to {target!r}, which lands outside its directory")
        if not os.path.isfile(source):
            raise self.refuse(name, f"is a hardlink to {target!r}, which is not a file unpacked before it")
        with open(source, "rb") as f:
            self.file(name, f, executable=bool(os.stat(source).st_mode & 0o111))

    def check_links(self) -> None:
        # A link checked when written can come to point outside through a link
        # written after it ("x -> y/.." then "y -> ."): look again at the end.
        for name in self.links:
            path = os.path.join(self.root, *self.parts(name))
            if not self.inside(os.path.realpath(path)):
                raise self.refuse(name, f"is a symlink to {os.readlink(path)!r}, which lands outside its directory "
                                        "through links written after it")


def _unpack_tar(archive: Path, kind: str, unpacker: _Unpacker) -> None:
    mode = "r:" if kind == "tar" else f"r:{kind}"
    with _reading(unpacker.archive_name):
        tar = tarfile.open(archive, mode)
    with tar:
        while True:
            with _reading(unpacker.archive_name):
                member = tar.next()
            if member is None:
                break
            _tar_member(tar, member, unpacker)


def _tar_member(tar: tarfile.TarFile, member: tarfile.TarInfo, unpacker: _Unpacker) -> None:
    name = member.name
    unpacker.count(name, member.size if member.isreg() else 0)
    unpacker.parts(name)
    kind = _special(member)
    if kind is not None:
        raise unpacker.refuse(name, f"is {kind}: an engine archive holds only files, directories and links")
    if member.issym() and member.linkname.startswith("/"):
        raise unpacker.refuse(name, f"is a symlink to the absolute path {member.linkname!r}, outside its directory")
    unpacker.second_line = lambda: tarfile.data_filter(member, unpacker.root)
    if member.isdir():
        unpacker.directory(name)
    elif member.issym():
        unpacker.symlink(name, member.linkname)
    elif member.islnk():
        unpacker.hardlink(name, member.linkname)
    elif member.isreg():
        with _reading(unpacker.archive_name):
            source = tar.extractfile(member)
        assert source is not None
        unpacker.file(name, source, executable=bool(member.mode & 0o111))
    else:
        raise unpacker.refuse(name, f"is of tar type {member.type!r}, which an engine archive does not hold")


def _special(member: tarfile.TarInfo) -> str | None:
    if member.ischr():
        return "a character device"
    if member.isblk():
        return "a block device"
    if member.isfifo():
        return "a fifo"
    return None


def _unpack_zip(archive: Path, unpacker: _Unpacker) -> None:
    with _reading(unpacker.archive_name):
        zf = zipfile.ZipFile(archive)
    with zf:
        with _reading(unpacker.archive_name):
            infos = zf.infolist()
        # The central directory declares every size up front: refuse a bomb
        # before writing anything; the bytes written are counted as well.
        if len(infos) > unpacker.max_members:
            raise UnsafeArchive(
                f"{unpacker.archive_name} holds {len(infos)} members, more than {unpacker.max_members}: "
                "that is not an engine build"
            )
        declared = sum(info.file_size for info in infos)
        if declared > unpacker.max_bytes:
            raise UnsafeArchive(
                f"{unpacker.archive_name} says it unpacks to {_size(declared)}, more than "
                f"{_size(unpacker.max_bytes)}: that is not an engine build"
            )
        for info in infos:
            _zip_member(zf, info, unpacker)


def _zip_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, unpacker: _Unpacker) -> None:
    name = info.filename
    unpacker.count(name, 0)
    unpacker.parts(name)
    mode = info.external_attr >> 16
    if mode and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
        kind = _zip_special(mode)
        raise unpacker.refuse(name, f"is {kind}: an engine archive holds only files, directories and links")
    if stat.S_ISLNK(mode):
        if info.file_size > _MAX_LINK:
            raise unpacker.refuse(name, f"is a symlink whose target is {info.file_size} bytes long")
        with _reading(unpacker.archive_name), zf.open(info) as f:
            raw = f.read(_MAX_LINK + 1)
        if len(raw) > _MAX_LINK:
            raise unpacker.refuse(name, f"is a symlink whose target is over {_MAX_LINK} bytes long")
        unpacker.bytes_written += len(raw)
        unpacker.symlink(name, raw.decode("utf-8", errors="surrogateescape"))
    elif info.is_dir() or stat.S_ISDIR(mode):
        unpacker.directory(name)
    else:
        with _reading(unpacker.archive_name):
            source = zf.open(info)
        with source:
            unpacker.file(name, source, executable=bool(mode & 0o111))


def _zip_special(mode: int) -> str:
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISFIFO(mode):
        return "a fifo"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return f"of file type {stat.S_IFMT(mode):#o}"


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if n >= scale:
            return f"{n // scale} {unit}" if n % scale == 0 else f"{n / scale:.1f} {unit}"
    return f"{n} bytes"
