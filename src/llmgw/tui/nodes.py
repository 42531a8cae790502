"""The nodes pane: one row per node, changed in place as its events arrive."""

from __future__ import annotations

from typing import Iterable

from llmgw import render
from llmgw.tui import columns
from llmgw.tui.store import FleetStore
from llmgw.tui.table import TablePane

SEEN = [key for key, _ in columns.NODE_COLUMNS].index("seen")


class NodesPane(TablePane):
    COLUMNS = columns.NODE_COLUMNS
    SORT_BY = ("node",)
    NOUN = "nodes"
    KIND = "node"

    def load(self, store: FleetStore) -> None:
        """Show exactly the store's nodes (after a snapshot)."""
        self.replace_rows({node_id: columns.node_cells(view, store.seen_ago(node_id))
                           for node_id, view in store.nodes.items()})

    def changed(self, store: FleetStore, node_ids: Iterable[str]) -> None:
        self.update_rows({
            node_id: columns.node_cells(store.nodes[node_id], store.seen_ago(node_id)) if node_id in store.nodes else None
            for node_id in node_ids
        })

    def tick(self, store: FleetStore) -> None:
        """Let "last seen" count up between heartbeats."""
        self.tick_column(SEEN, lambda node_id: render.ago(store.seen_ago(node_id)), store.nodes)
