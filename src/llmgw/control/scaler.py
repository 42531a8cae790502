"""How many replicas an elastic model wants now: from its policy, the routers' demand and an operator's pin.

A model with ``replicas: {min: M, max: X}`` (``llmgw.config.scale.Scale``)
has X slots; the scaler says how many of them should run, its *target*.  The
reconciler places the slots below the target and drains the ones above it
(``llmgw.control.slot``: sleeping, draining, stopping).  Decisions, in the
order they are taken each pass:

- **pinned**: ``ctl scale MODEL N`` holds the target at N (within min and
  max) until the next reload or ``ctl scale MODEL --auto``;
- **cold start**: a model at 0 with a request waiting for it (held by a
  router) is woken: target 1;
- **idle**: nothing in flight or waiting and no request for ``idle_s``:
  back to ``min`` (0: the model sleeps);
- **load**: requests in flight, queued, held and waiting in the engines
  above ``target_inflight`` per wanted replica for ``up_after_s`` adds one
  (up to max); below it *with one fewer* for ``down_after_s`` removes one
  (down to min, and never below 1 by load alone: only idleness puts a model
  to sleep).

Until the fleet has settled after a (re)start the target is what runs (at
least min), and is not kept: a replica the agents report running is never
stopped for want of a figure the routers have not sent yet.  What each
decision did is counted (``counts``) for /metrics and told to ``note`` (the
journal) in words.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable

import attrs

from llmgw.config.scale import Scale
from llmgw.control.demand import Demand
from llmgw.history import JournalKind
from llmgw.render import age


@attrs.define
class ModelScale:
    """What the scaler keeps of one model between passes."""

    since: float  # when the scaler first saw it: an idle model's clock starts there
    target: int | None = None
    pinned: int | None = None
    above_since: float | None = None
    below_since: float | None = None
    # When a cold start began (target 0 → 1), until a replica is ready.
    woke_at: float | None = None
    # The last decision that moved the target down, in words (a sleeping slot shows them).
    down_words: str | None = None


def _no_note(kind: JournalKind, subject: str, reason: str = "", **where) -> None:
    return None


class Scaler:
    def __init__(self, demand: Demand, note: Callable[..., object] = _no_note):
        self.demand = demand
        self.note = note
        self.models: dict[str, ModelScale] = {}
        # (model, what) → how many times: "cold start", "up", "down", "sleep", "evicted", "cold start timed out".
        self.counts: Counter[tuple[str, str]] = Counter()

    def wanted(self, name: str, scale: Scale, running: int, ready: int, settled: bool, now: float) -> int:
        """How many of *name*'s slots should run; *running*: slots with a replica alive, *ready*: those ready."""
        if not scale.elastic:
            return scale.max
        state = self.models.get(name)
        if state is None:
            state = self.models[name] = ModelScale(since=now)
        if state.target is None:
            kept = min(scale.max, max(scale.min, running))
            if not settled:
                return kept
            state.target = kept
        state.target = min(scale.max, max(scale.min, state.target))  # a reload may have moved the bounds
        if ready and state.woke_at is not None:
            state.woke_at = None
            state.since = now  # its idle time counts from when it could first answer, not from the wait
        if state.pinned is not None:
            return min(scale.max, max(scale.min, state.pinned))
        demand = self.demand.model(name)
        if state.target == 0 and (demand.waiting or demand.inflight):
            self._move(name, state, 1, "cold start", JournalKind.COLD_START,
                       f"{demand.waiting} request(s) waiting and no replica", now)
            state.woke_at = state.since = now
            return state.target
        # Idle since the last request, or since it woke and was ready, whichever is later.
        last = max(demand.last_request_at if demand.last_request_at is not None else state.since, state.since)
        if state.target > scale.min and not demand.busy and now - last >= scale.idle_s:
            words = f"idle: no request for {age(now - last)}"
            kind = JournalKind.SLEPT if scale.min == 0 else JournalKind.SCALED_DOWN
            self._move(name, state, scale.min, "sleep" if scale.min == 0 else "down", kind, words, now)
            return state.target
        self._by_load(name, scale, state, demand.busy, now)
        return state.target

    def _by_load(self, name: str, scale: Scale, state: ModelScale, busy: int, now: float) -> None:
        target = state.target or 0
        if target and target < scale.max and busy > scale.target_inflight * target:
            state.below_since = None
            state.above_since = now if state.above_since is None else state.above_since
            if now - state.above_since >= scale.up_after_s:
                state.above_since = now  # the next one after up_after_s more
                self._move(name, state, target + 1, "up", JournalKind.SCALED_UP,
                           f"{busy} request(s) in flight or waiting, over {scale.target_inflight:g} for each of "
                           f"{target} replica(s) for {scale.up_after_s:g} s", now)
            return
        state.above_since = None
        if target > max(scale.min, 1) and busy < scale.target_inflight * (target - 1):
            state.below_since = now if state.below_since is None else state.below_since
            if now - state.below_since >= scale.down_after_s:
                state.below_since = now
                self._move(name, state, target - 1, "down", JournalKind.SCALED_DOWN,
                           f"{busy} request(s) in flight or waiting, under {scale.target_inflight:g} for each of "
                           f"{target - 1} replica(s) for {scale.down_after_s:g} s", now)
            return
        state.below_since = None

    def _move(self, name: str, state: ModelScale, target: int, what: str, kind: JournalKind, words: str,
              now: float) -> None:
        old, state.target = state.target, target
        if target < (old or 0):
            state.down_words = words
        self.counts[(name, what)] += 1
        self.note(kind, name, f"{old} → {target} replica(s): {words}", model=name)

    # -- what operators and the reconciler tell it --

    def pin(self, name: str, count: int | None, scale: Scale, now: float) -> int:
        """Hold *name* at *count* (None: give it back to its policy); the target now."""
        state = self.models.setdefault(name, ModelScale(since=now))
        if count is None:
            state.pinned = None
            if state.target is None:
                state.target = scale.min
            return state.target
        if not scale.min <= count <= scale.max:
            raise ValueError(f"{name} scales between {scale.min} and {scale.max} replicas (its replicas: in "
                             f"server.yaml); {count} is outside that")
        state.pinned = count
        state.target = count
        self.note(JournalKind.SCALED_UP if count else JournalKind.SLEPT, name,
                  f"pinned at {count} replica(s) by an operator (ctl scale)", model=name)
        return count

    def unpin_all(self) -> None:
        """A reload gives every model back to its (new) policy."""
        for state in self.models.values():
            state.pinned = None

    def evicted(self, name: str, now: float) -> None:
        """One of *name*'s replicas is stopped to make room: it wants one fewer, until its demand says otherwise."""
        state = self.models.get(name)
        if state is not None and state.target:
            state.target -= 1
            state.down_words = "evicted to make room for a model with requests waiting"
        self.counts[(name, "evicted")] += 1

    def forget(self, names: set[str]) -> None:
        for name in [n for n in self.models if n not in names]:
            del self.models[name]
        self.demand.forget(names)

    # -- words for ctl --

    def waking(self, name: str, now: float) -> str | None:
        """"starting on demand: 3 requests waiting, 12 s" while a cold start is under way; else None."""
        state = self.models.get(name)
        if state is None or state.woke_at is None:
            return None
        waiting = self.demand.model(name).waiting
        return f"starting on demand: {waiting} request(s) waiting, {now - state.woke_at:.0f} s"

    def asleep(self, name: str, now: float) -> str:
        """Why a slot of *name* above its target runs nothing: for a sleeping replica's line."""
        state = self.models.get(name)
        last = self.demand.model(name).last_request_at
        when = f"last request {age(now - last)} ago" if last is not None else "no request since the server started"
        if state is not None and state.pinned is not None:
            return f"pinned at {state.pinned} replica(s) (ctl scale); {when}"
        waiting = self.demand.model(name).waiting
        if waiting and (state is None or state.target is None):
            return (f"{waiting} request(s) waiting: it starts once the fleet has settled after the server's start "
                    "(fleet.settle_s)")
        if state is None or not state.target:
            if state is not None and state.down_words and not state.down_words.startswith("idle"):
                return f"scaled to zero: {state.down_words}; {when}"
            return f"idle: scaled to zero, {when}"
        words = state.down_words or "not needed now"
        return f"scaled down: {words}; {when}"

    def pinned(self, name: str) -> int | None:
        state = self.models.get(name)
        return None if state is None else state.pinned

    def target(self, name: str) -> int | None:
        state = self.models.get(name)
        return None if state is None else state.target
