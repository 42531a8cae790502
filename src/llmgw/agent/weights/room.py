"""Room for a download: the free space where it lands, less what the downloads under way there still need.

A listing (or a server's Content-Length) says how big a download is before
a byte of it is written, so a download that cannot fit is refused then, in
the node's words, rather than found out when the disk is full and every
other download and engine log on that filesystem fails with it.  What is
already there and will be reused (files a repository's earlier try
finished, a ``.partial`` to resume) is not needed again; what the other
downloads on the same filesystem have yet to write is not free.

A download whose size nobody said (no listing, no length) cannot be
checked ahead; it may write what is free where it lands when it begins
(``ceiling``), less what the others still need, and is stopped there rather
than fill the disk every other download and engine log share.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Hashable

from llmgw.sizes import bytes_words, size_words

from .errors import FetchError


def free_bytes(directory: Path) -> int:
    """Bytes the agent's user may still write on *directory*'s filesystem (f_bavail: root's reserve is not room)."""
    vfs = os.statvfs(directory)
    return vfs.f_bavail * vfs.f_frsize


class Room:
    """The bytes each download under way still has to write, by filesystem, and whether another one fits."""

    def __init__(self, node_id: str | None = None, free: Callable[[Path], int] = free_bytes):
        self.node = f"{node_id}: " if node_id else ""
        self._free = free
        # key -> (the filesystem's st_dev, how many bytes it still has to write)
        self._held: dict[Hashable, tuple[int, Callable[[], int]]] = {}

    def take(self, key: Hashable, directory: Path, needs: int, what: str,
             remaining: Callable[[], int] | None = None) -> None:
        """Hold room in *directory* for *key*'s *needs* bytes more, or FetchError saying why they do not fit.

        *remaining* says how many of them are still to come as it writes
        (default: all of them); ``give_back`` ends the hold.
        """
        try:
            device = os.stat(directory).st_dev
            free = self._free(directory)
        except OSError as e:
            raise FetchError(f"{self.node}cannot tell how much room {directory} has ({e.strerror}); "
                             "check that the directory exists and the agent's user may read it") from None
        others = sum(max(0, left()) for k, (dev, left) in self._held.items() if dev == device and k != key)
        if needs > free - others:
            words = size_words
            if words(needs) in (words(free), words(free - others)):
                words = bytes_words  # rounded, it would read as enough
            under_way = f", {words(others)} of it for downloads under way" if others else ""
            raise FetchError(f"{self.node}{directory} has {words(free)} free{under_way}; {what} needs "
                             f"{words(needs)} more; nothing was downloaded. Free space there "
                             "(llmgw ctl weights --collect removes weights no model wants)")
        self._held[key] = (device, remaining if remaining is not None else (lambda: needs))

    def ceiling(self, directory: Path) -> int:
        """The most a download of no stated size may write in *directory*: free there, less what the others need."""
        device, free = os.stat(directory).st_dev, self._free(directory)
        return max(0, free - sum(max(0, left()) for dev, left in self._held.values() if dev == device))

    def give_back(self, key: Hashable) -> None:
        self._held.pop(key, None)

    def held(self) -> int:
        """Bytes the downloads under way still have to write, on every filesystem."""
        return sum(max(0, left()) for _, left in self._held.values())
