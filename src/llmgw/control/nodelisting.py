"""Which nodes ``llmgw.cp.nodes`` lists: the query, and the fleet's indexes that answer it.

A listing is by state and label, in id order, a page at a time.  The fleet
(``llmgw.control.fleet``) tells its ``NodeIndex`` every node that arrives,
changes or goes; the index keeps the ids in each state and with each label,
and puts them in order only when a listing first asks, so ten thousand
heartbeats sort nothing.
"""

from __future__ import annotations

import bisect
import itertools
from typing import TYPE_CHECKING, Any, Mapping

import attrs

from llmgw.states import NodeState

if TYPE_CHECKING:
    from llmgw.control.fleet import Node

# The most nodes one page of ``llmgw.cp.nodes`` holds: a page of nodes with
# eight GPUs each stays far inside the link's 16 MiB message.
MAX_PAGE = 2000


@attrs.frozen
class NodeQuery:
    """Which nodes ``llmgw.cp.nodes`` lists: by state and label, in id order, a page at a time.

    ``after`` is the last id of the page before (a cursor: a node that
    registers or leaves between pages moves no other node), ``limit`` the
    most this page holds; None is no condition.
    """

    state: NodeState | None = None
    label: tuple[str, str] | None = None
    after: str | None = None
    limit: int | None = None

    @classmethod
    def parse(cls, state: Any = None, label: Any = None, after: Any = None, limit: Any = None) -> NodeQuery:
        """The query an operator's call asks for; ``ValueError`` says which argument is wrong and how."""
        if state is not None:
            known = ", ".join(s.value for s in NodeState)
            if not isinstance(state, str) or state not in {s.value for s in NodeState}:
                raise ValueError(f"state {state!r} is none of {known}")
            state = NodeState(state)
        if label is not None:
            if not isinstance(label, str) or "=" not in label or label.startswith("="):
                raise ValueError(f"label {label!r} is not KEY=VALUE (gpu=h100)")
            key, _, value = label.partition("=")
            label = (key, value)
        if after is not None and not isinstance(after, str):
            raise ValueError(f"after {after!r} is not a node id (the last id of the page before)")
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_PAGE):
            raise ValueError(f"limit {limit!r} is not a number of nodes from 1 to {MAX_PAGE}")
        return cls(state, label, after, limit)


class NodeIndex:
    """The ids of *nodes* (the fleet's own mapping, read as it changes) in order, in each state and with each label."""

    def __init__(self, nodes: Mapping[str, Node]):
        self._nodes = nodes
        # Every id in order, for paged listings; None once a node came or went.
        self._ids: list[str] | None = None
        # The ids of the nodes in each state, and with each label (KEY, VALUE),
        # kept by ``moved``, put in order when a listing first asks (``_ordered``).
        self._members: dict[NodeState | tuple[str, str], set[str]] = {}
        self._in_order: dict[NodeState | tuple[str, str], list[str]] = {}

    def moved(self, node_id: str, old: Node | None, new: Node | None) -> None:
        """*node_id*'s state and labels went from *old* (None: it is new) to *new* (None: it is gone)."""
        if old is None or new is None:
            self._ids = None
        before, after = (None if old is None else old.state), (None if new is None else new.state)
        if before is not after:
            self._index(node_id, before, after)
        had = {} if old is None else old.inventory.labels
        has = {} if new is None else new.inventory.labels
        if had is not has:
            for pair in had.items() - has.items():
                self._index(node_id, pair, None)
            for pair in has.items() - had.items():
                self._index(node_id, None, pair)

    def _index(self, node_id: str, left: NodeState | tuple[str, str] | None,
               joined: NodeState | tuple[str, str] | None) -> None:
        """*node_id* leaves the state or label *left* and joins *joined* (None: neither)."""
        if left is not None:
            members = self._members.get(left)
            if members is not None:
                members.discard(node_id)
                if not members:
                    del self._members[left]
            self._in_order.pop(left, None)
        if joined is not None:
            self._members.setdefault(joined, set()).add(node_id)
            self._in_order.pop(joined, None)

    def _ordered(self, key: NodeState | tuple[str, str] | None) -> list[str]:
        """The ids in *key*'s state or with its label, in order; every id for None."""
        if key is None:
            if self._ids is None:
                self._ids = sorted(self._nodes)
            return self._ids
        ids = self._in_order.get(key)
        if ids is None:
            ids = self._in_order[key] = sorted(self._members.get(key, ()))
        return ids

    def listing(self, query: NodeQuery) -> list[Node]:
        """The nodes *query* asks for, in id order.

        A state or label is answered from its index; with both, the smaller
        one is walked and the other condition checked on each node.
        """
        conditions = [key for key in (query.state, query.label) if key is not None]
        ids = self._ordered(min(conditions, key=lambda k: len(self._members.get(k, ()))) if conditions else None)
        start = 0 if query.after is None else bisect.bisect_right(ids, query.after)
        out: list[Node] = []
        for node_id in itertools.islice(ids, start, None):
            node = self._nodes[node_id]
            if query.state is not None and node.state != query.state:
                continue
            if query.label is not None and node.inventory.labels.get(query.label[0]) != query.label[1]:
                continue
            out.append(node)
            if query.limit is not None and len(out) >= query.limit:
                break
        return out
