"""The node's side of weights: fetch them, say which it holds, and give back only what llmgw fetched.

* :mod:`.sources` — what a ``source:`` names, and the cache name of a fetched copy;
* :mod:`.fetch` — :class:`Fetcher`: single-flight, resumable, verified downloads with progress;
* :mod:`.inventory` — :func:`scan` the weights directories, :func:`fingerprint` the result;
* :mod:`.collect` — :func:`collect` (the node's own check before any unlink) and :func:`unwanted`.

See docs/weights.rst.
"""

from __future__ import annotations

from .collect import collect, unwanted
from .errors import ChecksumMismatch, FetchError, SizeMismatch
from .fetch import Fetcher
from .inventory import InventoryWatch, fingerprint, is_weights_name, scan
from .records import CollectResult, Progress, WeightsFile, WeightsReport
from .sources import Source, cache_name, is_cache_name, local_path_for, parse, partial_name

__all__ = [
    "ChecksumMismatch", "CollectResult", "FetchError", "Fetcher", "InventoryWatch", "Progress",
    "SizeMismatch", "Source", "WeightsFile", "WeightsReport", "cache_name", "collect", "fingerprint",
    "is_cache_name", "is_weights_name", "local_path_for", "parse", "partial_name", "scan", "unwanted",
]
