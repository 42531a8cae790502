"""The agent's side of a ``source:``: where its weights are on this node, and what a fetch sends.

What a source names and the cache name of a fetched copy are shared with the
control plane, in :mod:`llmgw.weightnames`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from llmgw.weightnames import WeightsSource, cache_name, parse


def local_path_for(source: str, weights_dir: str | Path, files: tuple[str, ...] | list[str] = ()) -> Path:
    """Where *source*'s weights are on this node: the path itself, or the cache name in *weights_dir*.

    For a repository that is its directory; for a split GGUF, the first part
    in its directory (what llama.cpp opens).  *files* are a repository's
    ``files:`` patterns.
    """
    parsed = parse(source)
    if parsed.path is not None:
        return Path(parsed.path)
    fetched = Path(weights_dir) / cache_name(source, files)
    if parsed.layout == "parts":
        return fetched / parsed.part_names()[0]
    return fetched


def request_headers(source: WeightsSource, environ: Mapping[str, str]) -> dict[str, str]:
    """Headers a fetch of *source* sends beyond the usual: ``HF_TOKEN`` for hf:// sources only.

    The token is never sent to an https:// source, which may be anybody's
    server; Twisted's redirect agent drops it when Hugging Face redirects to
    its CDN on another host.
    """
    token = environ.get("HF_TOKEN", "").strip()
    if source.kind == "hf" and token:
        return {"Authorization": f"Bearer {token}"}
    return {}
