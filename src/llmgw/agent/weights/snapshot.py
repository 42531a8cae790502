"""Fetching a repository, or a split GGUF's parts, into one directory that appears only when whole.

``hf://ORG/REPO[@REV]`` names every file of a repository (or those the
model's ``files:`` patterns allow), and the first part of a split GGUF names
all its parts.  Either is fetched into ``<cache name>.partial/`` — a
directory, locked while it is written — file by file, each exactly as a
single file is (resumable with Range, size always checked, sha256 where the
hub's listing gives one: LFS files), and only when every file is there is
the directory renamed to its cache name.  A crash part-way leaves the
``.partial`` directory, which no scan reports as held and the next fetch
continues.

The listing is the hub's ``GET /api/models/ORG/REPO/revision/REV?blobs=true``,
read once; its commit then names every file's URL, so a branch that moves
during the download cannot mix two revisions.  Everything in it is checked
before a byte is fetched: its size, the number of files, each name (no
``..``, no absolute path, nothing that leaves the directory, no control
characters) and each size.  See docs/weights.rst.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import stat
from pathlib import Path
from urllib.parse import quote

import attrs
from twisted.internet import task
from twisted.logger import Logger

from llmgw.weightnames import PARTIAL_SUFFIX, WeightsSource, cache_name, partial_name

from .body import read_json_body
from .errors import FetchError
from .partial import finished, finished_directory, lock_directory, lock_partial, make_directory, release_partial
from .records import Progress
from .refusals import refused

log = Logger()

MANIFEST = ".llmgw-repo.json"  # hidden: a scan never reports it
MAX_PATH_BYTES = 1024
MAX_SEGMENT_BYTES = 255
MAX_DEPTH = 8  # folders within the repository; a scan looks this deep
MAX_FILE_BYTES = 1 << 50  # a PiB: more is a listing that lies
_COMMIT = re.compile(r"[0-9a-f]{40}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@attrs.frozen
class RepoFile:
    """One file of a listing: its path in the repository, its size and, for an LFS file, its sha256."""

    path: str
    size: int
    sha256: str | None = None


@attrs.frozen
class Listing:
    commit: str | None  # None: the hub gave none, and the revision names the files
    files: tuple[RepoFile, ...]


def why_not_path(name: object) -> str | None:
    """Why *name* from a listing may not be written under the repository's directory; None when it may."""
    if not isinstance(name, str) or not name:
        return "is not a file name"
    if _CONTROL.search(name) or "\\" in name:
        return "has a control character or a backslash in it"
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        return "is not valid UTF-8"
    if size > MAX_PATH_BYTES:
        return f"is over {MAX_PATH_BYTES} bytes long"
    if name.startswith("/"):
        return "is an absolute path"
    segments = name.split("/")
    if any(s in ("", ".", "..") for s in segments):
        return "has an empty, '.' or '..' segment, which would leave its folder"
    if len(segments) > MAX_DEPTH + 1:
        return f"is more than {MAX_DEPTH} folders deep"
    if any(len(s.encode("utf-8")) > MAX_SEGMENT_BYTES for s in segments):
        return f"has a segment over {MAX_SEGMENT_BYTES} bytes"
    if name.endswith(PARTIAL_SUFFIX):
        return f"ends in {PARTIAL_SUFFIX}, which llmgw gives downloads in progress"
    return None


def parse_listing(body: bytes, repository: str, max_files: int) -> Listing:
    """The :class:`Listing` in the hub's answer *body*, or FetchError saying what is wrong with it."""
    what = f"the hub's listing of {repository}"
    try:
        info = json.loads(body)
    except ValueError:
        raise FetchError(f"{what} is not JSON (cut short?); try again, or check HF_ENDPOINT") from None
    siblings = info.get("siblings") if isinstance(info, dict) else None
    if not isinstance(siblings, list):
        raise FetchError(f"{what} has no list of files (siblings); check HF_ENDPOINT")
    if len(siblings) > max_files:
        raise FetchError(f"{what} has {len(siblings)} files, over the limit of {max_files} for one repository")
    commit = info.get("sha")
    if commit is not None and not (isinstance(commit, str) and _COMMIT.fullmatch(commit)):
        raise FetchError(f"{what} gives the commit {str(commit)[:80]!r}, which is not 40 hex digits")
    files: dict[str, RepoFile] = {}
    for entry in siblings:
        name = entry.get("rfilename") if isinstance(entry, dict) else None
        why = why_not_path(name)
        if why is not None:
            raise FetchError(f"{what} names a file {str(name)[:200]!r}, which {why}; llmgw fetches none of it")
        size = entry.get("size")
        if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_FILE_BYTES:
            raise FetchError(f"{what} gives {name} the size {repr(size)[:40]}; llmgw checks every file's size "
                             "and needs a whole number of bytes, at most a PiB")
        sha256 = None
        lfs = entry.get("lfs")
        if lfs is not None:
            sha256 = lfs.get("sha256") if isinstance(lfs, dict) else None
            if not (isinstance(sha256, str) and _SHA256.fullmatch(sha256)):
                raise FetchError(f"{what} gives {name} an LFS sha256 {str(sha256)[:80]!r}, not 64 hex digits")
            if lfs.get("size", size) != size:
                raise FetchError(f"{what} gives {name} two sizes, {size} and {lfs.get('size')!r}")
        if name in files:
            raise FetchError(f"{what} names {name} twice")
        files[name] = RepoFile(path=name, size=size, sha256=sha256)
    folders = {"/".join(n.split("/")[:i]) for n in files for i in range(1, n.count("/") + 1)}
    clash = sorted(folders & set(files))
    if clash:
        raise FetchError(f"{what} names {clash[0]} as both a file and a folder")
    return Listing(commit=commit, files=tuple(files[n] for n in sorted(files)))


def matches(path: str, patterns: tuple[str, ...]) -> bool:
    """Whether a model's ``files:`` *patterns* allow *path* (none allow all), as huggingface_hub's allow_patterns."""
    if not patterns:
        return True
    return any(fnmatch.fnmatchcase(path, p + "*" if p.endswith("/") else p) for p in patterns)


class Snapshot:
    """One fetch of a repository (or a split GGUF's parts) into its cache directory."""

    def __init__(self, fetcher, src: WeightsSource, patterns: tuple[str, ...], pace=None):
        self.f, self.src, self.patterns, self.pace = fetcher, src, patterns, pace
        self.final = fetcher.weights_dir / cache_name(src.text, patterns)
        self.staging = fetcher.weights_dir / partial_name(src.text, patterns)
        self.total = 0
        self.before = 0  # bytes of the files already complete
        self.received = 0
        self.current = None  # the download of one file under way
        self.started = fetcher._clock.seconds()

    def target(self) -> Path:
        """The path an engine opens: the directory, or a split GGUF's first part in it."""
        if self.src.layout == "parts":
            return self.final / self.src.part_names()[0]
        return self.final

    async def run(self) -> Path:
        try:
            self.f.weights_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise FetchError(f"cannot create the weights directory {self.f.weights_dir}: {e.strerror}; "
                             "create it and give it to the agent's user") from None
        while True:
            if finished_directory(self.final):
                return self.target()
            fd = lock_directory(self.staging)
            if fd is None:
                log.info("{staging} is being written by another process; waiting", staging=self.staging)
                await task.deferLater(self.f._clock, self.f._lock_poll_s, lambda: None)
                continue
            try:
                if finished_directory(self.final):
                    _remove_if_empty(self.staging)
                    return self.target()
                try:
                    await self._fetch(fd)
                except BaseException as e:
                    self._report(self.before, final=True, error=self.f.error_text(self.src.text, e))
                    raise
                self._report(self.total, final=True)
                return self.target()
            finally:
                os.close(fd)
                _remove_if_empty(self.staging)  # a listing refused: nothing was staged

    async def _fetch(self, fd: int) -> None:
        listing = await self._listing()
        wanted = self._wanted(listing)
        self.total = sum(f.size for f in wanted)
        if self.f._max_bytes is not None and self.total > self.f._max_bytes:
            raise FetchError(f"{self.src.text} is {self.total} bytes in {len(wanted)} files, over the limit of "
                             f"{self.f._max_bytes}; choose fewer with the model's files: patterns")
        reuse = self._reusable(fd, listing)
        needs = _still_needed(self.staging, wanted) if reuse else self.total
        # Before the staging directory is touched: a download refused for room changes nothing.
        self.f.room.take(self, self.f.weights_dir, needs, self.src.text, lambda: needs - self._written())
        try:
            self._begin(fd, listing, wanted, reuse)
            revision = listing.commit or self.src.revision
            for item in wanted:
                await self._file(item, revision)
                self.before += item.size
        finally:
            self.f.room.give_back(self)
        # Every file's data is on disk (each download syncs it); make their names so too, then the rename.
        folders = {self.staging / "/".join(item.path.split("/")[:i])
                   for item in wanted for i in range(item.path.count("/") + 1)}
        for folder in sorted(folders, reverse=True):
            _sync(folder)
        os.replace(self.staging, self.final)
        _sync(self.f.weights_dir)
        log.info("fetched {source} into {final} ({count} files, {size} bytes)", source=self.src.text,
                 final=self.final, count=len(wanted), size=self.total)

    async def _listing(self) -> Listing:
        url = f"{self.src.endpoint}/api/models/{self.src.repository}/revision/{self.src.revision}?blobs=true"
        response = await self.f.get(self.src, url)
        if response.code != 200:
            raise await refused(self.f, self.src, response, url)
        body = await read_json_body(response, self.f._clock, self.f._idle_timeout_s, self.f.max_listing_bytes,
                                    f"the hub's listing of {self.src.repository} ({url})")
        return parse_listing(body, self.src.repository, self.f.max_files)

    def _wanted(self, listing: Listing) -> list[RepoFile]:
        at = f"{self.src.repository} at {self.src.revision}"
        if self.src.layout == "parts":
            by_path = {f.path: f for f in listing.files}
            names = self.src.part_names()
            missing = [n for n in names if n not in by_path]
            if missing:
                raise FetchError(f"{at} has no {missing[0]}, part of the split GGUF {self.src.file_name} "
                                 f"({len(names)} parts); check the source")
            return [by_path[n] for n in names]
        wanted = [f for f in listing.files if matches(f.path, self.patterns)]
        if not wanted:
            allowed = f" that the model's files: patterns {list(self.patterns)} allow" if self.patterns else ""
            raise FetchError(f"{at} has no files{allowed}; check the source and the patterns")
        return wanted

    def _reusable(self, fd: int, listing: Listing) -> bool:
        """Whether the staging directory holds an earlier try at this very commit, whose files are kept."""
        try:
            with open(MANIFEST, "rb", opener=lambda p, flags: os.open(p, flags | os.O_NOFOLLOW, dir_fd=fd)) as f:
                earlier = json.loads(f.read(self.f.max_listing_bytes * 2))
        except (OSError, ValueError):
            earlier = None
        return isinstance(earlier, dict) and earlier.get("commit") == listing.commit and listing.commit is not None

    def _begin(self, fd: int, listing: Listing, wanted: list[RepoFile], reuse: bool) -> None:
        """Start the staging directory afresh unless it holds an earlier try at this very commit."""
        manifest = {"source": self.src.text, "revision": self.src.revision, "commit": listing.commit,
                    "files": [attrs.asdict(f) for f in wanted]}
        if not reuse:
            _empty(fd)
        data = json.dumps(manifest, indent=1).encode()
        tmp = MANIFEST + ".tmp"
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=fd)
        with os.fdopen(out, "wb") as f:
            f.write(data)
        os.replace(tmp, MANIFEST, src_dir_fd=fd, dst_dir_fd=fd)

    async def _file(self, item: RepoFile, revision: str) -> None:
        final = self.staging / item.path
        _make_parents(self.staging, item.path)
        if item.size == 0:
            os.close(os.open(final, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644))
            return
        url = (f"{self.src.endpoint}/{self.src.repository}/resolve/{revision}/"
               + "/".join(quote(s, safe="") for s in item.path.split("/")))
        one = attrs.evolve(self.src, url=url, file_name=item.path, layout="file")
        partial = final.with_name(final.name + PARTIAL_SUFFIX)
        from .fetch import _Download

        while not finished(final, item.size):
            locked = lock_partial(partial)
            if locked is None:  # only a process that does not hold the directory's lock writes it
                raise FetchError(f"{partial} is locked by a process outside llmgw's own; stop it")
            try:
                download = self.current = _Download(self.f, one, locked, partial, final, item.sha256, item.size,
                                                    report=self._from_download, pace=self.pace)
                await download.run()
                self.received += download.received
            finally:
                self.current = None
                release_partial(locked, partial)

    def _written(self) -> int:
        """Bytes this fetch has written so far, the file under way included."""
        return self.received + (self.current.received if self.current is not None else 0)

    def _from_download(self, download, rate, final: bool, error: str | None) -> None:
        if error is None:  # the snapshot reports the end, and an error, itself
            self._report(self.before + download.done, rate=rate)

    def _report(self, done: int, *, rate: float | None = None, final: bool = False, error: str | None = None) -> None:
        """Progress of the whole, under the repository's name (or the split GGUF's first part)."""
        if self.f._progress is None:
            return
        if final:
            elapsed = self.f._clock.seconds() - self.started
            rate = self.received / elapsed if elapsed > 0 else None
        report = Progress(source=self.src.text, file_name=self.src.file_name, bytes_done=done, bytes_total=self.total or None,
                          rate_bps=rate, final=final, error=error)
        try:
            self.f._progress(report)
        except Exception:
            log.failure("progress callback failed for {source}", source=self.src.text)


def _still_needed(staging: Path, wanted: list[RepoFile]) -> int:
    """Bytes still to write into *staging* for *wanted*: a file whole, or the part of one to resume, is there."""
    needs = 0
    for item in wanted:
        final = staging / item.path
        if _size_of(final) == item.size:
            continue
        resumed = _size_of(final.with_name(final.name + PARTIAL_SUFFIX))
        needs += item.size - (resumed if resumed is not None and resumed <= item.size else 0)
    return needs


def _size_of(path: Path) -> int | None:
    """The size of the regular file at *path*; None for anything else, or nothing."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def _make_parents(staging: Path, path: str) -> None:
    """The folders of *path* inside *staging*, each a real directory (never a link someone put there)."""
    here = staging
    for segment in path.split("/")[:-1]:
        here = here / segment
        make_directory(here)
        if not stat.S_ISDIR(os.lstat(here).st_mode):
            raise FetchError(f"{here} is in the way of a folder of the repository; remove {staging}")


def _empty(fd: int) -> None:
    """Remove everything in the staging directory *fd* (llmgw's own, locked): an earlier try at another commit."""
    with os.scandir(fd) as entries:
        names = [(e.name, e.is_dir(follow_symlinks=False)) for e in entries]
    for name, is_dir in names:
        if is_dir:
            shutil.rmtree(name, dir_fd=fd)
        else:
            os.unlink(name, dir_fd=fd)


def _remove_if_empty(path: Path) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass


def _sync(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
