"""When a started control plane may begin placing: after the fleet has had time to report.

Agents come back with their engines still running, and a slot that looks
empty for a second must not be started twice.  So placing waits
``fleet.settle_s`` from the start; then, while nodes still arrive (one
connected or registered within ``settle_quiet_s``, or connections still in
their handshakes), it waits on, but not past ``settle_max_s`` from the
start.  Once settled, it stays settled: a node arriving later is a node
arriving, not a fleet coming back.

A new leader (server.yaml's ``ha:``) knows which nodes to wait for: the
ones the last leader listed in etcd (``llmgw.ha.members``).  Given them as
*expected*, the wait is for exactly those: placing begins as soon as each
has registered here since the start (or is lost here) and no connection is
mid-handshake — however short ``settle_s`` is, and however long one agent's
backoff — and never past ``settle_max_s``.
"""

from __future__ import annotations

from typing import Collection

from llmgw.states import NodeState

#: How many of the nodes still awaited the words name before "and N more".
NAMED = 1


class Settle:
    def __init__(self, fleet, started: float, settle_s: float, quiet_s: float, max_s: float | None,
                 expected: Collection[str] = ()):
        self._fleet = fleet  # its nodes, last_arrival and handshaking()
        self.started = started
        self.settled_at = started + settle_s
        self._settle_s, self._quiet_s, self._max_s = settle_s, quiet_s, max_s
        self._deadline = started + max(settle_s, max_s if max_s is not None else settle_s)
        self.expected = frozenset(expected)
        # settle_s 0: place at once, whatever is arriving (unless told which nodes to wait for)
        self._settled = settle_s <= 0 and not self.expected
        self._seen: tuple[float, str | None] | None = None

    def again(self, now: float, expected: Collection[str] = ()) -> Settle:
        """The same wait, begun again at *now* (a new leader), for *expected*'s nodes when any are named."""
        return Settle(self._fleet, now, self._settle_s, self._quiet_s, self._max_s, expected)

    def missing(self) -> list[str]:
        """The expected nodes not back yet: neither registered since the start nor lost, by name."""
        nodes = self._fleet.nodes
        return sorted(n for n in self.expected if (node := nodes.get(n)) is None
                      or (node.registered_at < self.started and node.state is not NodeState.LOST))

    def waiting(self, now: float) -> str | None:
        """Why nothing is placed yet after a start, in words; None once the fleet has settled (for good)."""
        if self._settled:
            return None
        if self._seen is not None and self._seen[0] == now:
            return self._seen[1]  # once per pass, not once per slot
        if self.expected:
            why = self._awaited() if now < self._deadline else None
        elif now < self.settled_at:
            return f"waiting {self.settled_at - now:.0f} s for the fleet to report before placing (fleet.settle_s)"
        else:
            why = self._arriving(now) if now < self._deadline and self._quiet_s > 0 else None
        if why is None:
            self._settled = True
        self._seen = (now, why)
        return why

    def _awaited(self) -> str | None:
        missing = self.missing()
        if missing:
            named = ", ".join(missing[:NAMED])
            more = f" and {len(missing) - NAMED} more" if len(missing) > NAMED else ""
            return (f"waiting for {named}{more} to come back after the failover before placing "
                    "(fleet.settle_max_s)")
        return self._handshakes()

    def _handshakes(self) -> str | None:
        # Connections mid-handshake are arrivals not yet heard: a hub too busy to finish any
        # handshake for settle_quiet_s (a whole fleet reconnecting) is not a quiet one.
        handshaking = self._fleet.handshaking()
        if handshaking > 0:
            return (f"waiting for the fleet to finish coming back before placing: the hub has {handshaking} "
                    f"connection{'s' if handshaking != 1 else ''} still in handshakes (fleet.settle_quiet_s)")
        return None

    def _arriving(self, now: float) -> str | None:
        why = self._handshakes()
        if why is not None:
            return why
        last = self._fleet.last_arrival
        if last is None:
            return "waiting for the fleet to come back before placing: no node has registered yet"
        if now - last < self._quiet_s:
            return (f"waiting for the fleet to finish coming back before placing: a node connected or "
                    f"registered {now - last:.0f} s ago (fleet.settle_quiet_s)")
        return None
