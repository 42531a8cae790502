"""The replicas pane: refetched after shard events, reconciled row by row."""

from __future__ import annotations

from llmgw import render
from llmgw.tui import columns
from llmgw.tui.store import FleetStore
from llmgw.tui.table import TablePane

AGE = [key for key, _ in columns.REPLICA_COLUMNS].index("age")


class ReplicasPane(TablePane):
    COLUMNS = columns.REPLICA_COLUMNS
    SORT_BY = ("model", "index")
    NOUN = "replicas"
    KIND = "replica"

    def load(self, store: FleetStore) -> None:
        self.replace_rows({replica_id: columns.replica_cells(view, store.replica_age(replica_id))
                           for replica_id, view in store.replicas.items()})

    def tick(self, store: FleetStore) -> None:
        """Let AGE count up between fetches, as the nodes' SEEN does."""
        self.tick_column(AGE, lambda replica_id: render.age(store.replica_age(replica_id)), store.replicas)
