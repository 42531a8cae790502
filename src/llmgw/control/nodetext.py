"""The JSON text of the nodes ``llmgw.cp.nodes`` lists, kept per node and written again only where it changed.

A listing of ten thousand nodes is asked for every few seconds, and between
two listings most nodes sent a heartbeat that moved a few figures and
nothing else.  ``NodeTexts`` keeps each node's text as last written, field
by field, beside the value it was written from, and writes again only the
fields whose value is a new object; the text is the link serializer's for the
same wire form, byte for byte (``tests/control/test_nodetext.py``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Iterable

from llmgw.records import Inventory
from llmgw.views import NODE_FACTS, DiskSummary, GpuSummary
from llmgw.wire import JsonText, encode_json, json_text, sparse_json_text

if TYPE_CHECKING:
    from llmgw.control.fleet import Node


class NodeTexts:
    """Per node, the JSON text of its view and of its brief as last listed; ``forget`` a node that is gone."""

    def __init__(self):
        self._views: dict[str, _NodeText] = {}
        self._briefs: dict[str, _NodeText] = {}

    def forget(self, node_id: str) -> None:
        self._views.pop(node_id, None)
        self._briefs.pop(node_id, None)

    def listing(self, nodes: Iterable[Node], now: float, brief: bool = False) -> JsonText:
        """*nodes* as the link's JSON list, ready to send: each node's ``NodeBrief`` with *brief*, else its ``NodeView``."""
        text = self.brief if brief else self.view
        return JsonText(("[" + ",".join([text(node, now) for node in nodes]) + "]").encode())

    def view(self, node: Node, now: float) -> str:
        """``to_wire(node.view(now))`` as JSON text, writing again only what the node reported that changed since the last.

        The same text, byte for byte, as the link's serializer writes for
        that wire form (``tests/control/test_nodetext.py``): the node's own
        fields, then its facts (``NODE_FACTS``), then the control plane's.
        """
        held = self._views.get(node.id)
        if held is None or held.inventory is not node.inventory:
            parts = held.parts if held is not None else {}
            for name in NODE_FACTS:
                value = getattr(node.inventory, name)
                part = parts.get(name)
                if part is None or part[0] is not value:
                    parts[name] = (value, json_text(value))
            held = self._views[node.id] = _NodeText(node.inventory, parts)
        own = (node.state, node.reason, node.cordoned, node.state_since, node.registered_at,
               node.certificate_not_after, tuple(node.link_warnings))
        if held.own != own:
            held.own = own
            held.head = (f'{{"id":{encode_json(node.id)},"state":{encode_json(node.state.value)},'
                         f'"reason":{_scalar(node.reason)},"cordoned":{_scalar(node.cordoned)},"last_seen":')
            held.tail = (f',"state_since":{_scalar(node.state_since)},"registered_at":{_scalar(node.registered_at)},'
                         + ",".join([f'"{name}":{held.parts[name][1]}' for name in NODE_FACTS])
                         + f',"certificate_not_after":{_scalar(node.certificate_not_after)},'
                         f'"link_warnings":{encode_json(list(node.link_warnings))}}}')
        return f'{held.head}{_scalar(node.last_seen)},"seen_ago_s":{_scalar(round(max(0.0, now - node.last_seen), 1))}{held.tail}'

    def brief(self, node: Node, now: float) -> str:
        """``NodeBrief.of(node.view(now))`` as ``sparse_json_text`` writes it, kept as ``view`` keeps the view.

        A field at its default is left out (``to_sparse_wire``).  The GPUs
        are summed again only when a heartbeat brought new figures for them,
        the filesystems only when they changed; the text before
        ``seen_ago_s`` only when one of the node's own fields did.
        """
        held = self._briefs.get(node.id)
        if held is None:
            held = self._briefs[node.id] = _NodeText(None, {})
        if held.inventory is not node.inventory:
            parts = held.parts
            for name, source, write in _BRIEF_FACTS:
                value = getattr(node.inventory, source)
                part = parts.get(name)
                if part is None or part[0] is not value:
                    text = write(value)
                    parts[name] = (value, "" if text == _LEFT_OUT.get(name, "null") else f',"{name}":{text}')
            held.inventory = node.inventory
            held.tail = ""
        own = (node.state, node.reason, node.cordoned, node.certificate_not_after, node.link_warnings)
        if held.own != own:
            held.own = own
            reason = "" if node.reason is None else f',"reason":{encode_json(node.reason)}'
            held.head = (f'{{"id":{encode_json(node.id)},"state":{encode_json(node.state.value)}{reason},'
                         f'"cordoned":{_scalar(node.cordoned)},"seen_ago_s":')
            held.tail = ""
        if not held.tail:
            expires = node.certificate_not_after
            held.tail = "".join([
                *(part for _, part in held.parts.values()),
                "" if expires is None else f',"certificate_not_after":{_scalar(expires)}',
                f',"link_warnings":{encode_json(list(node.link_warnings))}' if node.link_warnings else "",
                "}",
            ])
        return f'{held.head}{_scalar(round(max(0.0, now - node.last_seen), 1))}{held.tail}'


class _NodeText:
    """A node's listing text as last written: each fact's text, and its view's text around the two figures that move.

    Made anew when the node's inventory changes; its head and tail again
    when one of the node's own fields does (``own``).
    """

    __slots__ = ("inventory", "parts", "own", "head", "tail")

    def __init__(self, inventory: Inventory, parts: dict[str, tuple[Any, str]]):
        self.inventory = inventory
        self.parts = parts
        self.own: tuple | None = None
        self.head = self.tail = ""


def _scalar(value: Any) -> str:
    """One of a node's own fields as the link's JSON writes it: a finite float as ``repr`` does, as ``json`` does."""
    if value is None:
        return "null"
    if type(value) is int:
        return int.__repr__(value)
    if value is True:
        return "true"
    if value is False:
        return "false"
    if type(value) is float and math.isfinite(value):
        return float.__repr__(value)
    return encode_json(value)


def _gpu_summary_text(cards: list | None) -> str:
    """``sparse_json_text(GpuSummary.of(cards))``, written here: it is made again at every heartbeat's listing."""
    summary = GpuSummary.of(cards)
    if summary is None:
        return "null"
    fields = [f'"kinds":{encode_json(summary.kinds)}'] if summary.kinds else []
    if summary.memory_used_bytes is not None:
        fields.append(f'"memory_used_bytes":{summary.memory_used_bytes}')
    if summary.memory_total_bytes is not None:
        fields.append(f'"memory_total_bytes":{summary.memory_total_bytes}')
    return "{" + ",".join(fields) + "}"


# What a node's brief (``NodeBrief``) says of its inventory, in the brief's
# order: each field's name, the inventory's field it comes from, and how its
# text is written; a field whose text is its default's (``null``, or
# ``_LEFT_OUT``'s) is left out.
_BRIEF_FACTS: tuple[tuple[str, str, Callable[[Any], str]], ...] = (
    ("address", "address", _scalar),
    ("cpu", "cpu", sparse_json_text),
    ("memory_total_bytes", "memory_total_bytes", _scalar),
    ("memory_available_bytes", "memory_available_bytes", _scalar),
    ("gpu_summary", "gpus", _gpu_summary_text),
    ("disk_summary", "filesystems", lambda filesystems: sparse_json_text(DiskSummary.of(filesystems))),
    ("engines", "engines", sparse_json_text),
    ("warnings", "warnings", sparse_json_text),
)
_LEFT_OUT = {"warnings": "[]"}
