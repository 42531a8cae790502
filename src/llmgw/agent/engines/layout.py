"""What an engine install is on disk: its folder, the marker written last, and the folders that are not (yet) one.

``<root>/<name>/<version or venv key>/`` is an install once it holds
``.llmgw-installed`` (JSON: version, path, sha256, installed_at, and a note);
a folder without one, or one named ``.tmp-…`` (an unpack in progress, or an
install being removed), is what a crash left and is removed.  Downloads wait
in ``<root>/.downloads`` under the Fetcher's cache names.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Iterable

from twisted.logger import Logger

from llmgw.agent.engines import archive
from llmgw.durable import write_file
from llmgw.engines.llamacpp import BINARY

log = Logger()

MARKER = ".llmgw-installed"
DOWNLOADS = ".downloads"
TEMP = ".tmp-"
# Where llama.cpp's archives keep llama-server: at the top (recent tarballs,
# under one folder named after the release) or in build/bin (the zips).
BINARY_PLACES = (".", "build/bin")


class Unusable(Exception):
    """An engine build cannot be installed, or does not run, on this node; ``str()`` is the node's reason."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def merge_extra(downloaded: Path, into: Path) -> None:
    """A companion archive (a CUDA runtime) unpacked into *into*, the folder of llama-server, never over a file.

    Its files go beside the binary, whose RUNPATH is ``$ORIGIN``; an
    archive whose members all sit in one folder gives that folder's files.
    """
    extra = into.parent / f"{TEMP}extra-{downloaded.name}"
    try:
        archive.extract(downloaded, extra)
        entries = sorted(extra.iterdir())
        top = entries[0] if len(entries) == 1 and entries[0].is_dir() and not entries[0].is_symlink() else extra
        for entry in sorted(top.iterdir()):
            if os.path.lexists(into / entry.name):
                raise Unusable(f"{downloaded.name} holds {entry.name}, which the main archive has already")
            os.rename(entry, into / entry.name)
    finally:
        shutil.rmtree(extra, ignore_errors=True)


def find_binary(temp: Path, asset: str) -> Path:
    tops = [temp, *sorted(p for p in temp.iterdir() if p.is_dir() and not p.is_symlink())]
    for top in tops:
        for place in BINARY_PLACES:
            candidate = top / place / BINARY
            if candidate.is_file() and candidate.resolve().is_relative_to(temp.resolve()):
                return candidate
    raise Unusable(f"{asset} holds no {BINARY} (looked at its top, in build/bin/, and one folder down)")


def publish(temp: Path, final: Path, marker: dict) -> None:
    """*temp* renamed to *final* (a markerless leftover there is removed first), then its marker, last."""
    if final.exists():
        remove_install(final)
    os.rename(temp, final)
    try:
        write_marker(final, marker)
    except BaseException:
        remove_install(final)
        raise


def write_marker(directory: Path, marker: dict) -> None:
    write_file(directory / MARKER, json.dumps(marker, indent=2).encode(), private=False, replace=True)


def read_marker(directory: Path) -> dict | None:
    if directory.name.startswith(TEMP) or not directory.is_dir() or directory.is_symlink():
        return None
    try:
        marker = json.loads((directory / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(marker, dict) or not isinstance(marker.get("path"), str):
        return None
    return marker


def read_installs(root: Path, names: Iterable[str]) -> list[tuple[str, Path, dict]]:
    """Every marked install under ``<root>/<name>/``, as (name, folder, marker); a folder without its marker is removed."""
    found = []
    for name in names:
        try:
            children = sorted((root / name).iterdir())
        except FileNotFoundError:
            continue
        for child in children:
            marker = read_marker(child)
            if marker is None:
                log.info("removing {child}: an install that did not finish", child=child)
                remove_install(child)
            else:
                found.append((name, child, marker))
    return found


def remove_install(directory: Path) -> None:
    """The marker first, so a crash halfway leaves a folder start() removes, never a half install marked whole."""
    if directory.is_symlink() or not directory.is_dir():
        directory.unlink(missing_ok=True)
        return
    (directory / MARKER).unlink(missing_ok=True)
    shutil.rmtree(directory, ignore_errors=True)


def remove_download(downloads: Path, name: str) -> None:
    (downloads / name).unlink(missing_ok=True)


def prune_downloads(downloads: Path, keep: set[str]) -> None:
    try:
        entries = list(downloads.iterdir())
    except FileNotFoundError:
        return
    for entry in entries:
        if entry.name not in keep and entry.is_file():
            entry.unlink(missing_ok=True)
