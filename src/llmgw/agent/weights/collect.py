"""Taking back weights llmgw fetched and the catalog no longer wants — and nothing else.

The control plane knows the catalog; the node knows its disk.  So the
control plane proposes paths (``llmgw.control.weights.unwanted``), and the node checks every one itself before
it unlinks anything: a control plane that is wrong, newer than this agent,
or tampered with must not be able to talk a node into deleting a file.

A path is removed only when all of these hold:

* it is a string, absolute, without NUL bytes, and already in plain form
  (no ``.``, ``..``, ``//`` or trailing ``/`` — a path that needs
  normalising is refused rather than normalised, since ``a/link/..`` is not
  where it looks);
* its directory is the agent's own cache directory itself (as configured,
  or that directory's resolved path), not a subdirectory and not anywhere
  else;
* its name is a cache name (``llmgw-<16 hex>-<name>``), which only llmgw
  gives a file: an operator's file never has one;
* at the moment of removal, that name in that directory is a regular file —
  not a symbolic link (wherever it points: llmgw fetches only regular files,
  so a link there was put by somebody else) — or a directory llmgw fetched a
  repository into: one whose ``.llmgw-repo.json`` lists every file in it.  A
  directory with anything else in it (a file, a link, a folder the list does
  not account for) is refused whole, naming what llmgw did not fetch.

The check and the unlink use a descriptor of the cache directory and a bare
file name (``lstat``/``unlink`` with ``dir_fd``), so no path component can be
swapped for a link between the check and the removal; the worst a race can do
is make the unlink remove a link instead of a file — never a link's target.
"""

from __future__ import annotations

import json
import os
import stat

from twisted.logger import Logger

from llmgw.weightnames import is_cache_name

from .records import CollectResult
from .snapshot import MANIFEST, why_not_path

log = Logger()


def collect(weights_dir: str | os.PathLike, requested_paths: object) -> CollectResult:
    """Remove those of *requested_paths* that llmgw fetched into *weights_dir*; refuse the rest, saying why."""
    cache = os.path.normpath(os.path.abspath(os.fspath(weights_dir)))
    removed: list[str] = []
    refused: dict[str, str] = {}
    if isinstance(requested_paths, (str, bytes)):
        requested_paths = [requested_paths]
    try:
        requested = list(requested_paths)  # type: ignore[call-overload]
    except TypeError:
        key = repr(requested_paths)
        return CollectResult(refused={key: f"refused {key}: not a list of paths"})
    try:
        real = os.path.realpath(cache, strict=True)
        dir_fd = os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        for item in requested:
            key = item if isinstance(item, str) else repr(item)
            refused[key] = f"refused {key}: the cache directory {cache} cannot be opened ({e.strerror})"
        return CollectResult(refused=refused)
    try:
        for item in requested:
            key = item if isinstance(item, str) else repr(item)
            if key in refused or key in removed:
                continue
            why = _why_not(item, cache, real)
            if why is None:
                why = _remove(dir_fd, os.path.basename(item))
            if why is None:
                removed.append(key)
                log.info("removed {path}: fetched by llmgw and no longer in the catalog", path=key)
            else:
                refused[key] = f"refused {key}: {why}"
                log.info("{message}", message=refused[key])
    finally:
        os.close(dir_fd)
    return CollectResult(removed=removed, refused=refused)


def _why_not(path: object, cache: str, real: str) -> str | None:
    """Why *path* may not be removed, judged from the text alone; None when it may."""
    if not isinstance(path, str):
        return f"not a path but {type(path).__name__}"
    if not path:
        return "an empty path"
    if "\x00" in path:
        return "contains a NUL byte"
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return "not valid UTF-8"
    if not os.path.isabs(path):
        return f"not an absolute path; llmgw removes only files directly in {cache}"
    plain = os.path.normpath(path)
    if plain.startswith("//"):  # POSIX keeps a leading // as it is
        plain = "/" + plain.lstrip("/")
    parent = os.path.dirname(plain)
    if parent not in (cache, real):
        if _inside(plain, cache) or _inside(plain, real):
            return f"in a subdirectory of {cache}; llmgw fetches only into the directory itself"
        return f"outside {cache}"
    if plain != path:
        if ".." in path.split("/"):
            return "has '..' in it; send the plain path"
        return "not a plain path (has '.', '//' or a trailing '/'); send the plain path"
    if not is_cache_name(os.path.basename(path)):
        return "not a file llmgw fetched (no cache name); llmgw never removes an operator's files"
    return None


def _inside(path: str, directory: str) -> bool:
    return path.startswith(directory.rstrip("/") + "/")


def _remove(dir_fd: int, name: str) -> str | None:
    """Unlink *name* in the directory *dir_fd* if it is a regular file; why not otherwise."""
    try:
        st = os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return "no such file"
    except OSError as e:
        return f"cannot be examined ({e.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return "a symbolic link; llmgw fetches only regular files and never removes through a link"
    if stat.S_ISDIR(st.st_mode):
        return _remove_repository(dir_fd, name)
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return "no such file"
    except OSError as e:
        return f"could not be removed ({e.strerror})"
    return None


MAX_MANIFEST_BYTES = 64 << 20


def _remove_repository(dir_fd: int, name: str) -> str | None:
    """Remove the repository llmgw fetched into the directory *name*, if everything in it is what it fetched."""
    try:
        top = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as e:
        return f"cannot be opened ({e.strerror})"
    try:
        listed = _manifest(top)
        if isinstance(listed, str):
            return listed
        files, folders = _contents(top, "")
        stranger = sorted((files - listed - {MANIFEST}) | (folders - _folders_of(listed)))
        if stranger:
            return (f"holds {stranger[0]}, which llmgw did not fetch ({len(stranger)} such); "
                    "llmgw removed nothing of it: remove the directory by hand")
        for path in sorted(files, key=lambda p: (-p.count("/"), p)):
            _at(top, path, os.unlink)
        for path in sorted(folders, key=lambda p: (-p.count("/"), p)):
            _at(top, path, os.rmdir)
    except OSError as e:
        return f"could not be removed whole ({e.strerror})"
    finally:
        os.close(top)
    try:
        os.rmdir(name, dir_fd=dir_fd)
    except OSError as e:
        return f"could not be removed ({e.strerror})"
    return None


def _manifest(top: int) -> set[str] | str:
    """The files the directory's .llmgw-repo.json lists, or why there is no such list to trust."""
    try:
        fd = os.open(MANIFEST, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=top)
    except FileNotFoundError:
        return f"a directory without {MANIFEST}, so not one llmgw fetched a repository into"
    except OSError as e:
        return f"its {MANIFEST} cannot be read ({e.strerror})"
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_MANIFEST_BYTES + 1)
    try:
        entries = json.loads(data)["files"] if len(data) <= MAX_MANIFEST_BYTES else None
        paths = {e["path"] for e in entries}
    except (ValueError, KeyError, TypeError):
        paths = None
    if paths is None or any(why_not_path(p) is not None for p in paths):
        return f"its {MANIFEST} is not a list of the files llmgw fetched; remove the directory by hand"
    return paths


def _contents(fd: int, prefix: str) -> tuple[set[str], set[str]]:
    """Every file (anything but a folder: links too) and folder under *fd*, as paths from the top."""
    files: set[str] = set()
    folders: set[str] = set()
    with os.scandir(fd) as entries:
        found = [(e.name, e.is_dir(follow_symlinks=False)) for e in entries]
    for name, is_dir in found:
        path = prefix + name
        if not is_dir:
            files.add(path)
            continue
        folders.add(path)
        sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
        try:
            more_files, more_folders = _contents(sub, path + "/")
        finally:
            os.close(sub)
        files |= more_files
        folders |= more_folders
    return files, folders


def _folders_of(paths: set[str]) -> set[str]:
    return {"/".join(p.split("/")[:i]) for p in paths for i in range(1, p.count("/") + 1)}


def _at(top: int, path: str, act) -> None:
    """*act* (unlink or rmdir) on *path* under *top*, through descriptors that never follow a link."""
    *folders, name = path.split("/")
    fds = []
    try:
        here = top
        for folder in folders:
            here = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=here)
            fds.append(here)
        act(name, dir_fd=here)
    finally:
        for fd in reversed(fds):
            os.close(fd)
