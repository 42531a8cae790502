"""The node's side of weights: fetch them, say which it holds, and give back only what llmgw fetched.

* :mod:`llmgw.weightnames` — what a ``source:`` names, and the cache name of a fetched copy
  (shared with the control plane, so it lives outside this package);
* :mod:`.sources` — where a source's weights are on this node, what a fetch of it sends;
* :mod:`.fetch` — :class:`Fetcher`: single-flight, resumable, verified downloads with progress;
* :mod:`.pace` — a fetch held to a minimum rate and a deadline (agent.yaml's ``weights:``);
* :mod:`.snapshot` — a repository (``hf://ORG/REPO``) or a split GGUF, fetched into one directory
  that appears only when every file is there;
* :mod:`.inventory` — :func:`scan` the weights directories, :func:`fingerprint` the result;
* :mod:`.collect` — :func:`collect`, the node's own check before any unlink.

See docs/weights.rst.
"""

from __future__ import annotations

from llmgw.weightnames import WeightsSource, cache_name, is_cache_name, parse, partial_name

from .collect import collect
from .errors import ChecksumMismatch, FetchError, SizeMismatch
from .fetch import Fetcher
from .inventory import InventoryWatch, fingerprint, is_weights_name, model_directories, scan
from .records import CollectResult, Progress, WeightsFile, WeightsReport
from .sources import local_path_for

__all__ = [
    "ChecksumMismatch", "CollectResult", "FetchError", "Fetcher", "InventoryWatch", "Progress",
    "SizeMismatch", "WeightsFile", "WeightsReport", "WeightsSource", "cache_name", "collect", "fingerprint",
    "is_cache_name", "is_weights_name", "local_path_for", "model_directories", "parse", "partial_name", "scan",
]
