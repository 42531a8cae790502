"""Fair shares of one model's slots between the clients that wait for them.

A *flow* is one client's part of a model's queue: an API key's, or, on a
router without keys, one client address's.  When a slot frees and new
requests wait (retries go first: ``admission.ModelQueue`` keeps them apart),
it goes to the head of one flow, chosen so:

1. the highest band with a flow that may take a slot: every ``interactive``
   flow before any ``batch`` one (``router.keys[].priority``);
2. a flow at its cap (``router.keys[].max_inflight`` slots held at once)
   may not, and waits for one of its own to end;
3. among the rest, the flow that holds the fewest slots now — running or
   stalled on a client that stopped reading: a held slot counts whatever its
   client does with it — and between flows holding as many, the one served
   longest ago.

This is deficit round-robin with every request costing one slot and each
flow's deficit being the slots it holds: what a request will cost is not
known when it is admitted (its answer's length), but what a flow holds now
is, and it is what that flow keeps from the others.  A flow that holds no
slot is served at the next free slot its band may take, however many
requests another flow has queued; between flows that hold as many, each
waits at most one turn of each other flow.

Pure: no clock, no Deferreds.  ``admission.ModelQueue`` holds the waiters'
timers and callbacks and asks ``pick`` which flow is next.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from llmgw.config.routing import KEY_PRIORITIES

W = TypeVar("W")

# router.keys[].priority, highest first; the index is the band.
BANDS = KEY_PRIORITIES
BAND = {name: index for index, name in enumerate(BANDS)}


class Flow(Generic[W]):
    """One client's slots and waiters on one model."""

    __slots__ = ("name", "band", "cap", "held", "waiters", "served_at")

    def __init__(self, name: str, band: int = 0, cap: int | None = None):
        self.name = name
        self.band = band
        # None: no cap of its own, only the model's slots.
        self.cap = cap
        # Slots it holds now (leases not yet released).
        self.held = 0
        # Its waiters, oldest first (an insertion-ordered dict used as a set).
        self.waiters: dict[W, None] = {}
        # The turn it was last served at; 0: never.
        self.served_at = 0

    @property
    def capped(self) -> bool:
        return self.cap is not None and self.held >= self.cap

    def __repr__(self) -> str:
        return f"Flow({self.name!r}, band={self.band}, held={self.held}, waiting={len(self.waiters)})"


class FairQueue(Generic[W]):
    """The flows of one model, and which of them waits in which band."""

    def __init__(self) -> None:
        # Every flow that holds a slot or has a waiter; no other is kept.
        self.flows: dict[str, Flow[W]] = {}
        # Flows with waiters, per band (insertion-ordered sets).
        self._waiting: tuple[dict[Flow[W], None], ...] = tuple({} for _ in BANDS)
        self._turn = 0
        # Waiters of every flow together.
        self.depth = 0

    def flow(self, name: str, band: int, cap: int | None) -> Flow[W]:
        """The flow named *name*, made if it is not kept; *band* and *cap* as configured now (a reload may move them)."""
        flow = self.flows.get(name)
        if flow is None:
            flow = self.flows[name] = Flow(name, band, cap)
            return flow
        flow.cap = cap
        if flow.band != band:
            if flow.waiters:
                del self._waiting[flow.band][flow]
                self._waiting[band][flow] = None
            flow.band = band
        return flow

    def push(self, flow: Flow[W], waiter: W) -> None:
        if not flow.waiters:
            self._waiting[flow.band][flow] = None
        flow.waiters[waiter] = None
        self.depth += 1

    def remove(self, flow: Flow[W], waiter: W) -> bool:
        """Take *waiter* out of *flow*; False if it was not there."""
        if flow.waiters.pop(waiter, True) is True:
            return False
        self.depth -= 1
        if not flow.waiters:
            del self._waiting[flow.band][flow]
            self.forget(flow)
        return True

    def forget(self, flow: Flow[W]) -> None:
        """Drop *flow* once it holds nothing and has no waiter, so an address seen once is not kept."""
        if not flow.held and not flow.waiters and self.flows.get(flow.name) is flow:
            del self.flows[flow.name]

    def pick(self) -> Flow[W] | None:
        """The flow whose head waiter gets the next free slot, or None if no waiting flow may take one."""
        for band in self._waiting:
            best = None
            for flow in band:
                if flow.cap is not None and flow.held >= flow.cap:
                    continue
                if best is None or flow.held < best.held or (flow.held == best.held and flow.served_at < best.served_at):
                    best = flow
            if best is not None:
                return best
        return None

    def served(self, flow: Flow[W]) -> None:
        """*flow* was given a slot (from the queue or straight away): it goes to the back of its ties."""
        self._turn += 1
        flow.served_at = self._turn

    def fullest(self) -> Flow[W] | None:
        """The flow with the most waiters (of the lowest band among equals): whose newest waiter a full queue drops."""
        best = None
        for band in self._waiting:
            for flow in band:
                if best is None or len(flow.waiters) >= len(best.waiters):
                    best = flow
        return best

    def ahead_of(self, flow: Flow[W]) -> int:
        """About how many waiters go before a new one of *flow*: higher bands', and one turn per flow of its band
        for each of its own waiters."""
        ahead = sum(sum(len(f.waiters) for f in band) for band in self._waiting[: flow.band])
        same = self._waiting[flow.band]
        turns = len(flow.waiters) + 1
        return ahead + sum(min(len(f.waiters), turns) for f in same if f is not flow) + turns - 1

    def waiting_flows(self) -> list[Flow[W]]:
        """The flows with waiters, highest band first."""
        return [f for band in self._waiting for f in band]
