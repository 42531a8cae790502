"""Which nodes were heard from lately: one batch to the dashboards every few seconds, not one event per heartbeat.

A steady node's heartbeats are not news (``llmgw.control.news``): its node
event comes every ``fleet.node_event_interval_s`` (30 s), and a dashboard's
"last seen" counted up to 34 s on a healthy node, twice the 15 s after which
the control plane calls it unreachable.  Publishing every heartbeat would
cost the server a 10 kB view per node every 5 s for every operator.

So a heartbeat only adds its node to a set (what ``noted`` costs), and every
``interval`` the control plane publishes ``llmgw.event.heard``: each node
heard since the last batch with the seconds since its last heartbeat, in
pages of ``HEARD_PAGE``.  A batch costs O(nodes heard), however many
heartbeats they sent and however many operators subscribe; a fleet of 10,000
nodes at 5 s heartbeats is one batch of about 250 kB per interval.  A
dashboard then shows "last seen" true to the interval plus the node's
heartbeat interval: 10 s at most with the defaults, about 5 on average.

The interval is a third of ``fleet.unreachable_after_s`` (5 s at its
default 15), at least ``LEAST_S``: so a node still heard is never shown as
silent for as long as would make it unreachable.
"""

from __future__ import annotations

from typing import Callable

from llmgw.views import HEARD_PAGE, HeardEvent

#: Batches per ``fleet.unreachable_after_s``.
PER_UNREACHABLE = 3
#: The shortest interval between batches, whatever ``unreachable_after_s`` says.
LEAST_S = 1.0


def interval(unreachable_after_s: float) -> float:
    """Seconds between two batches for a fleet that calls a node unreachable after *unreachable_after_s*."""
    return max(LEAST_S, unreachable_after_s / PER_UNREACHABLE)


class Heard:
    """The nodes heard from since the last batch."""

    def __init__(self) -> None:
        self._ids: set[str] = set()

    def noted(self, node_id: str) -> None:
        """*node_id*'s heartbeat was taken."""
        self._ids.add(node_id)

    def batch(self, last_seen: Callable[[str], float | None], now: float) -> list[HeardEvent]:
        """The events saying when each node noted since the last batch was last heard (*last_seen*), as of *now*.

        A node the fleet has forgotten since is left out.  Empty when none was heard.
        """
        ids, self._ids = self._ids, set()
        seen: dict[str, float] = {}
        for node_id in ids:
            at = last_seen(node_id)
            if at is not None:
                seen[node_id] = round(max(0.0, now - at), 1)
        items = list(seen.items())
        return [HeardEvent(dict(items[i:i + HEARD_PAGE])) for i in range(0, len(items), HEARD_PAGE)]
