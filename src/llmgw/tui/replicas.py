"""The replicas pane: refetched after shard events, reconciled row by row."""

from __future__ import annotations

from llmgw.tui import columns
from llmgw.tui.store import FleetStore
from llmgw.tui.table import TablePane


class ReplicasPane(TablePane):
    COLUMNS = columns.REPLICA_COLUMNS
    SORT_BY = ("model", "index")
    NOUN = "replicas"
    KIND = "replica"

    def load(self, store: FleetStore) -> None:
        self.replace_rows({replica_id: columns.replica_cells(view) for replica_id, view in store.replicas.items()})
