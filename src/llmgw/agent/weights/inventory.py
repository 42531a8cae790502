"""Which weights a node can see: files in its weights directories, with their sizes.

llmgw observes storage rather than managing it: whatever is in a weights
directory — fetched, copied by hand, on a filer — is reported, so placement
can prefer the node that already holds a model.  Some files look like
weights and are not: an empty file, a download still running (``.partial``
and the temporary names other tools use), a hidden file.  They are left out,
because a half-written file reported as weights sends a replica to a node
whose engine then fails to load it.

Symbolic links: a link to a regular file is reported at the link's path with
its target's size, because that is the file an engine opening the path
reads (a Hugging Face cache is made of such links).  A link to a directory
is not followed, so a scan cannot loop or wander off into a whole filer.
Hidden directories (``.cache``, ``.git``) are not entered either, nor one
with a temporary name: a repository being fetched is ``<cache name>.partial/``.

vLLM and SGLang load a directory, so the report names the model directories
among the files too (:func:`model_directories`): a repository llmgw fetched
(a cache-named directory in the cache directory, which appears only whole), and
any folder with a ``config.json`` or a split GGUF's first part in it.
"""

from __future__ import annotations

import hashlib
import os
import stat
from typing import Iterable

from twisted.logger import Logger

from llmgw.records import PATH
from llmgw.weightnames import SPLIT_GGUF, is_cache_name
from llmgw.wiretext import Text, refusal

from .records import WeightsFile, WeightsReport

log = Logger()

# Names other tools give a file while they write it.
TEMPORARY_SUFFIXES = (".partial", ".part", ".tmp", ".temp", ".incomplete", ".crdownload", ".download", ".lock")
MAX_DEPTH = 8


def is_weights_name(name: str) -> bool:
    """False for names that are never weights: hidden, temporary, editor backups."""
    return not (name.startswith(".") or name.endswith("~") or name.lower().endswith(TEMPORARY_SUFFIXES))


def scan(weights_dirs: Iterable[str | os.PathLike], *, max_depth: int = MAX_DEPTH) -> list[WeightsFile]:
    """The weights files under *weights_dirs*, in the order of the directories, each path once.

    A directory that does not exist is skipped (an unmounted filer looks like
    that), as is anything that cannot be read; this never raises for the
    state of the disk.
    """
    found: dict[str, WeightsFile] = {}
    for top in dict.fromkeys(os.fspath(d) for d in weights_dirs):
        for item in _walk(top, 0, max_depth):
            found.setdefault(item.path, item)
    return list(found.values())


def _walk(directory: str, depth: int, max_depth: int):
    try:
        with os.scandir(directory) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError as e:
        if depth == 0 and not isinstance(e, FileNotFoundError):
            log.info("weights dir {path} unreadable ({error}); skipped", path=directory, error=e.strerror)
        return
    for entry in entries:
        if entry.name.startswith("."):
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                # A repository still being fetched (<cache name>.partial/) holds nothing yet.
                if depth < max_depth and is_weights_name(entry.name):
                    yield from _walk(entry.path, depth + 1, max_depth)
                continue
            st = entry.stat(follow_symlinks=True)  # a link counts as what it points at
        except OSError:
            continue  # vanished, or a dangling link
        if not stat.S_ISREG(st.st_mode) or st.st_size == 0 or not is_weights_name(entry.name):
            continue
        try:
            entry.path.encode("utf-8")
        except UnicodeEncodeError:
            # Not valid UTF-8: no catalog can name it, and the link cannot carry it.
            continue
        if refusal(entry.path, Text.PATH, PATH) is not None:
            # A control character or a space at its end: the control plane would refuse the whole report.
            continue
        yield WeightsFile(path=entry.path, size_bytes=st.st_size)


def model_directories(files: Iterable[WeightsFile], cache_dir: str | os.PathLike | None = None) -> list[WeightsFile]:
    """The model directories *files* show, each with the bytes of the files under it, in path order.

    A directory counts when it is a cache-named directory directly in
    *cache_dir* (a fetched repository: it exists only once whole), or holds a
    ``config.json`` (what vLLM and SGLang read first) or the first part of a
    split GGUF.
    """
    files = list(files)
    cache = None if cache_dir is None else os.path.normpath(os.fspath(cache_dir))
    found: set[str] = set()
    for f in files:
        parent, name = os.path.split(f.path)
        if name == "config.json" or _first_part(name):
            found.add(parent)
        if cache is not None and f.path.startswith(cache + "/"):
            top = f.path[len(cache) + 1:].split("/", 1)
            if len(top) == 2 and is_cache_name(top[0]):
                found.add(f"{cache}/{top[0]}")
    sizes = dict.fromkeys(found, 0)
    for f in files:
        parent = os.path.dirname(f.path)
        while parent and parent != "/":
            if parent in sizes:
                sizes[parent] += f.size_bytes
            parent = os.path.dirname(parent)
    return [WeightsFile(path=path, size_bytes=sizes[path]) for path in sorted(sizes)]


def _first_part(name: str) -> bool:
    match = SPLIT_GGUF.fullmatch(name)
    return match is not None and int(match.group("index")) == 1


def fingerprint(files: Iterable[WeightsFile]) -> str:
    """A digest of the paths and sizes of *files*, whatever their order.

    It changes when a file appears, disappears, grows or shrinks, which is
    when the agent sends its list again; an empty list has a fingerprint too,
    because "holds nothing" is something to say.
    """
    digest = hashlib.sha256()
    for path, size in sorted({(f.path, f.size_bytes) for f in files}):
        digest.update(f"{size}\t{path}\n".encode("utf-8", "surrogatepass"))
    return digest.hexdigest()[:32]


class InventoryWatch:
    """Turns successive scans into reports, one per change.

    ``report(files)`` returns a :class:`WeightsReport` (``listed=True``) the
    first time and whenever the fingerprint changed, and None otherwise.
    ``reset()`` makes the next scan report again: call it when the link
    reconnects, since the new session knows nothing.
    """

    def __init__(self, cache_dir: str | os.PathLike | None = None):
        self._cache_dir = None if cache_dir is None else os.fspath(cache_dir)
        self._last: str | None = None

    def report(self, files: list[WeightsFile]) -> WeightsReport | None:
        current = fingerprint(files)
        if current == self._last:
            return None
        self._last = current
        return WeightsReport(files=list(files), fingerprint=current, listed=True, cache_dir=self._cache_dir,
                             directories=model_directories(files, self._cache_dir))

    def reset(self) -> None:
        self._last = None


def local_files(paths: list[str], listed: set[str]) -> list[WeightsFile]:
    """The files at *paths* that a scan did not list (*listed*), as the scan would report them."""
    found = {}
    for path in paths:
        try:
            size = os.stat(path).st_size
        except OSError:
            continue
        if path not in listed and os.path.isfile(path) and size > 0:
            found[path] = WeightsFile(path=path, size_bytes=size)
    return list(found.values())
