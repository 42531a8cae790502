"""What the catalog says about the weights the fleet holds: who holds a model, what nobody wants.

The cache name of a fetched file is a hash of its source, so the set of
files llmgw fetched that the catalog still wants is a calculation, not a
guess; anything without a cache name is an operator's and never listed.
The naming scheme is :mod:`llmgw.weightnames`, which the agent uses too;
the agent checks every path proposed here again before it removes one
(``llmgw.agent.weights.collect``).
"""

from __future__ import annotations

import os
from typing import Iterable

from llmgw.control.fleet import Fleet
from llmgw.records import Inventory, WeightsFile
from llmgw.weightnames import cache_name, is_cache_name, parse, source_prefix


def holds(inventory: Inventory, source: str | None, files: Iterable[str] = ()) -> bool:
    """Whether a node reported holding *source*'s weights (fetched, or the operator's path).

    A repository (``hf://ORG/REPO``, with its ``files:`` patterns) or a split
    GGUF is held where the node reports its cache-named directory; an
    operator's path, where the node reports it as a file or a model directory.
    """
    report = inventory.weights
    if source is None or report is None or not report.listed:
        return False
    try:
        parsed = parse(source)
    except ValueError:
        return False
    if parsed.fetched:
        name = cache_name(source, tuple(files))
        found = report.directories if parsed.directory else report.files
        return any(os.path.basename(f.path) == name for f in found)
    # The catalog's spelling and the node's scan of the same file may differ ("//", "/./").
    path = os.path.normpath(source)
    return any(os.path.normpath(f.path) == path for f in (*report.files, *report.directories))


def holders(fleet: Fleet, source: str | None, files: Iterable[str] = ()) -> frozenset[str]:
    files = tuple(files)
    return frozenset(node.id for node in fleet.nodes.values() if holds(node.inventory, source, files))


def free_for_weights(inventory: Inventory) -> int | None:
    """Free bytes where the node fetches into, or None when it did not say."""
    report = inventory.weights
    if report is None or report.cache_dir is None or inventory.filesystems is None:
        return None
    for fs in inventory.filesystems:
        if report.cache_dir in fs.weights_dirs:
            return fs.free_bytes
    return None


def unwanted(files: Iterable[WeightsFile], wanted_sources: Iterable[object],
             cache_dir: str | os.PathLike | None = None) -> list[WeightsFile]:
    """The files llmgw fetched that no source in *wanted_sources* names any more.

    A file is a candidate only if its name is a cache name — anything else is
    an operator's and never a candidate — and, when *cache_dir* is given,
    only if it is directly in that directory.  Every string in
    *wanted_sources* protects the file named after it, even one this version
    would not fetch, and every cache name of it with any ``files:`` patterns;
    ``None`` (a model without weights) protects nothing.
    """
    keep = {source_prefix(s) for s in wanted_sources if isinstance(s, str)}
    prefix = len(source_prefix(""))
    where = None if cache_dir is None else os.path.normpath(os.path.abspath(os.fspath(cache_dir)))
    found = []
    for f in files:
        name = os.path.basename(f.path)
        if not is_cache_name(name) or name[:prefix] in keep:
            continue
        if where is not None and os.path.dirname(os.path.normpath(f.path)) != where:
            continue
        found.append(f)
    return found


def unwanted_by_node(fleet: Fleet, wanted_sources: Iterable[str | None]) -> dict[str, list[WeightsFile]]:
    """Per node that listed its weights, the files :func:`unwanted` finds in its cache directory."""
    wanted = list(wanted_sources)
    out = {}
    for node in sorted(fleet.nodes.values(), key=lambda n: n.id):
        report = node.inventory.weights
        if report is None or not report.listed:
            continue
        # A repository llmgw fetched is a directory directly in the cache directory.
        out[node.id] = unwanted([*report.files, *report.directories], wanted, report.cache_dir)
    return out


def held_by_fabric(fleet: Fleet, source: str | None, files: Iterable[str] = ()) -> dict[str, int]:
    """How many nodes of each fabric hold *source* ("-" for nodes on no fabric).

    A shared filer mounted on twenty nodes counts twenty times: the question is
    whether a fabric can serve the model without a copy, and it can.
    """
    counts: dict[str, int] = {}
    files = tuple(files)
    for node in fleet.nodes.values():
        if not holds(node.inventory, source, files):
            continue
        fabrics = {a.fabric for a in node.inventory.infiniband or [] if a.fabric} or {"-"}
        for fabric in fabrics:
            counts[fabric] = counts.get(fabric, 0) + 1
    return counts
