"""When a started control plane may begin placing: after the fleet has had time to report.

Agents come back with their engines still running, and a slot that looks
empty for a second must not be started twice.  So placing waits
``fleet.settle_s`` from the start; then, while nodes still arrive (one
connected or registered within ``settle_quiet_s``, or connections still in
their handshakes), it waits on, but not past ``settle_max_s`` from the
start.  Once settled, it stays settled: a node arriving later is a node
arriving, not a fleet coming back.
"""

from __future__ import annotations


class Settle:
    def __init__(self, fleet, started: float, settle_s: float, quiet_s: float, max_s: float | None):
        self._fleet = fleet  # its last_arrival and handshaking()
        self.settled_at = started + settle_s
        self._quiet_s = quiet_s
        self._deadline = started + max(settle_s, max_s if max_s is not None else settle_s)
        self._settled = settle_s <= 0  # settle_s 0: place at once, whatever is arriving
        self._seen: tuple[float, str | None] | None = None

    def waiting(self, now: float) -> str | None:
        """Why nothing is placed yet after a start, in words; None once the fleet has settled (for good)."""
        if self._settled:
            return None
        if now < self.settled_at:
            return f"waiting {self.settled_at - now:.0f} s for the fleet to report before placing (fleet.settle_s)"
        if self._seen is not None and self._seen[0] == now:
            return self._seen[1]  # once per pass, not once per slot
        why = None
        if now < self._deadline and self._quiet_s > 0:
            last = self._fleet.last_arrival
            # Connections mid-handshake are arrivals not yet heard: a hub too busy to finish any
            # handshake for settle_quiet_s (a whole fleet reconnecting) is not a quiet one.
            handshaking = self._fleet.handshaking()
            if handshaking > 0:
                why = (f"waiting for the fleet to finish coming back before placing: the hub has {handshaking} "
                       f"connection{'s' if handshaking != 1 else ''} still in handshakes (fleet.settle_quiet_s)")
            elif last is None:
                why = "waiting for the fleet to come back before placing: no node has registered yet"
            elif now - last < self._quiet_s:
                why = (f"waiting for the fleet to finish coming back before placing: a node connected or "
                       f"registered {now - last:.0f} s ago (fleet.settle_quiet_s)")
        if why is None:
            self._settled = True
        self._seen = (now, why)
        return why
