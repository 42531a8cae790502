"""What every fleet screen shares: the link banner, and how the app tells a screen the fleet changed."""

from __future__ import annotations

from typing import Iterable

from rich.text import Text
from textual.widgets import Static

from llmgw.tui.store import FleetStore


class LinkBanner(Static):
    """A red line while the link to the hub is down; hidden while it is up."""

    def show_link(self, problem: str | None) -> None:
        self.update(Text(problem or ""))
        self.display = problem is not None


class FleetView:
    """A screen the app keeps current: it calls these as the store changes."""

    def fleet_loaded(self, store: FleetStore) -> None:
        """A snapshot replaced everything."""

    def nodes_changed(self, store: FleetStore, node_ids: Iterable[str]) -> None:
        """These nodes' views changed (events, coalesced)."""

    def replicas_changed(self, store: FleetStore) -> None:
        """The replicas were fetched again."""

    def tick(self, store: FleetStore) -> None:
        """Time passed: "last seen" moves on."""

    def show_link(self, problem: str | None) -> None:
        """The link's state changed: None is up and loaded."""

    def link_back(self) -> None:
        """The link came up and the fleet was loaded again: what a view fetched itself may be stale."""

    def journal_entry(self, entry) -> None:
        """The control plane recorded *entry* (``llmgw.history.JournalEntry``)."""

    def servers_changed(self) -> None:
        """The servers of the cluster (``app.servers``) or their roles changed."""
