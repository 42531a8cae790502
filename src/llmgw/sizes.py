"""Sizes in the words a person reads: the one rounding rule of every size a node or the server says.

Decimal units (1 GB is 10**9 bytes), as ``ctl nodes`` shows memory and as an
operator's ``min_memory_gb`` is read.  A figure is whole when it is within a
quarter of a whole number (MemTotal of an "8 GB" machine is 8.2 GB) or 10 and
more, else to a tenth: "8 GB", "7.5 GB", "73 GB", "2,000 GB", "1.5 MB".

A refusal compares a size with a need; rounded, the size may read as enough
("has 24 GB, needs 24" of 23.9 GB).  ``gb_short_of`` gives more digits there;
a sentence that compares two sizes in words falls back to bytes.
"""

from __future__ import annotations

import math

GB = 1e9
MB = 1e6


def figure(value: float) -> str:
    """*value* as a person says it: whole within a quarter of a whole number or from 10 up, else to a tenth."""
    whole = round(value)
    if abs(value) >= 10 or abs(value - whole) < 0.25:
        return f"{whole:,}"
    return f"{value:.1f}"


def gb(n_bytes: float) -> str:
    """*n_bytes* as a figure of GB, without the unit: "8", "7.5", "2,000"."""
    return figure(n_bytes / GB)


def gb_short_of(n_bytes: float, need_gb: float) -> str:
    """``gb(n_bytes)``, with more digits where rounding would make it read as
    enough: 23.9 GB against 24 is "23.9", never "has 24 GB of memory, needs 24"."""
    text = gb(n_bytes)
    value = n_bytes / GB
    digits = 1
    while _read(text) >= need_gb and digits <= 9:
        scale = 10**digits
        text = f"{value:,.{digits}f}"
        if _read(text) >= need_gb:
            text = f"{math.floor(value * scale) / scale:,.{digits}f}"
        digits += 1
    return text


def _read(text: str) -> float:
    return float(text.replace(",", ""))


def size_words(n_bytes: int) -> str:
    """A size with its unit: "2,000 GB", "7.5 GB", "120 MB", "900 bytes"."""
    if n_bytes >= GB:
        return f"{gb(n_bytes)} GB"
    if n_bytes >= MB:
        return f"{figure(n_bytes / MB)} MB"
    return bytes_words(n_bytes)


def bytes_words(n_bytes: int) -> str:
    """Every byte, for where a rounded size would read as enough: "73,040,000,000 bytes"."""
    return f"{n_bytes:,} bytes"


def downloaded(done: int | None, total: int | None) -> str:
    """A download's progress in MB: "120/253 MB", or "120 MB so far" where nobody said its length."""
    done_mb = figure((done or 0) / MB)
    if total:
        return f"{done_mb}/{figure(total / MB)} MB"
    return f"{done_mb} MB so far"
