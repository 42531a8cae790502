"""Starting a multi-node replica in order, and what each of its ranks waits for.

Every rank is placed at once (their nodes' GPUs and room held for them),
but only rank 0 is started.  Its node reports ``ShardStatus.rendezvous``
once the place where the other ranks meet (vLLM's master port, the Ray
head, SGLang's dist-init address) accepts connections; the control plane
then starts the other ranks with it as their ``ShardSpec.leader``.  Rank 0
is ready only once every rank joined: its node decides that.

Two waits are bounded by the shard's ``start_timeout_s``, on the control
plane's own clock (a node's ``since`` is not the control plane's to trust):
rank 0's rendezvous, counted from the first time rank 0 is seen past
fetching its weights; and every rank being ready, counted from the first
time all ranks have been started and none is still fetching.  A download
is not bounded here: its progress shows, and the node gives up on a stalled
one itself.
"""

from __future__ import annotations

from typing import Callable

import attrs

from llmgw.control.fleet import ReportedShard
from llmgw.control.placement import Placement
from llmgw.records import ShardSpec
from llmgw.states import ShardState


@attrs.define
class Startup:
    """One replica on its way up: the ranks not yet started, and when each wait began."""

    leader_node: str
    # Ranks 1..N-1, placed and held for, started once rank 0 reports its rendezvous.
    workers: list[tuple[str, ShardSpec]]
    # What placement must count for them meanwhile: (model, their placement).
    held: tuple[str, Placement]
    timeout_s: float
    placed_at: float
    # When each wait began: rank 0 placed (or first seen past fetching), and
    # the other ranks started (or every rank first seen past fetching).
    rendezvous_from: float | None = None
    workers_started_at: float | None = None
    joining_from: float | None = None

    def __attrs_post_init__(self) -> None:
        if self.rendezvous_from is None:
            self.rendezvous_from = self.placed_at

    def workers_starting(self, now: float) -> None:
        self.workers_started_at = self.joining_from = now

    @property
    def workers_started(self) -> bool:
        return self.workers_started_at is not None

    def overdue(self, by_rank: dict[int, ReportedShard], now: float) -> str | None:
        """Why the replica has waited too long, starting each wait's clock as it begins; None while it may wait."""
        fetching = any(s.status.state == ShardState.FETCHING for s in by_rank.values())
        if not self.workers_started:
            leader = by_rank[0]
            if leader.status.state == ShardState.FETCHING:
                self.rendezvous_from = None
                return None
            if self.rendezvous_from is None:
                self.rendezvous_from = now
            if now - self.rendezvous_from >= self.timeout_s:
                return (f"rank 0 on {leader.node_id} reported no rendezvous for the other ranks within "
                        f"{self.timeout_s:g} s (its start_timeout_s)")
            return None
        if fetching:
            self.joining_from = None
            return None
        if self.joining_from is None:
            self.joining_from = now
        late = [s for _, s in sorted(by_rank.items()) if s.status.state != ShardState.READY]
        if late and now - self.joining_from >= self.timeout_s:
            ranks = ", ".join(f"rank {s.status.spec.rank} on {s.node_id}" for s in late)
            return f"{ranks} not ready within {self.timeout_s:g} s of every rank starting (start_timeout_s)"
        return None


def waiting_for(shard: ReportedShard, by_rank: dict[int, ReportedShard], ranks: int) -> str | None:
    """What a reported rank waits for, in the control plane's words; None when it waits for nothing."""
    state, spec = shard.status.state, shard.status.spec
    if state == ShardState.FETCHING:
        return "fetching its weights"
    if state != ShardState.STARTING:
        return None
    if ranks == 1:
        return "waiting for its health probe"
    if spec.rank > 0:
        return f"joining rank 0 at {spec.leader}" if spec.leader else "joining rank 0"
    if shard.status.rendezvous is None:
        return "waiting for its rendezvous to accept connections"
    absent = [r for r in range(1, ranks) if r not in by_rank]
    if absent:
        return f"its rendezvous {shard.status.rendezvous} is open; rank {_ranks(absent)} not started yet"
    joining = [r for r in range(1, ranks) if by_rank[r].status.state != ShardState.READY]
    if joining:
        return f"waiting for rank {_ranks(joining)} to join at {shard.status.rendezvous}"
    return "every rank is up; waiting for them to join and for its health probe"


def not_started_words(leader_node: str) -> str:
    return f"waiting for rank 0's rendezvous on {leader_node}"


def _ranks(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks)


def not_whole(shards: list[ReportedShard], by_rank: dict[int, ReportedShard], expected: set[int],
              usable: Callable[[str], bool]) -> str:
    """Which ranks a multi-node replica lacks, and where they were: "rank 1 on node02: node02 is lost"."""
    words = []
    for rank in sorted(expected - set(by_rank)):
        gone = [s for s in shards if s.status.spec.rank == rank and not usable(s.node_id)]
        words.append(f"rank {rank} on {gone[0].node_id}: {gone[0].node_id} is lost" if gone
                     else f"rank {rank} is no longer reported by any node")
    return "; ".join(words)
