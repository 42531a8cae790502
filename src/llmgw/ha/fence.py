"""Fencing by epoch: what a command to an agent carries, and what a server that no longer leads answers.

Every command that changes a node (start, stop, drain a shard; cordon;
delete weights; a new engine plan) carries the keyword ``epoch=N`` when the
server runs with ``ha:``: the leader's epoch, the ``create_revision`` of
its election key in etcd, which grows with every new leader.  An agent
remembers the newest epoch it has seen and refuses an older one
(``llmgw.agent.fence``), so a leader that was paused, or cut off from etcd,
and wakes up still believing it leads cannot undo its successor's work.

The server's side asks ``ControlSession.command_epoch()`` before sending:
``None`` without ``ha:`` (no keyword is sent, so nothing changes on the
wire), the epoch while this server may command, or ``NotLeading`` raised,
and then the command is not sent at all.
"""

from __future__ import annotations

from typing import Any

from autobahn.wamp.exception import ApplicationError

from llmgw.link import uris

#: The most an epoch may be: etcd's revisions are signed 64-bit integers.
MOST = 2**63 - 1


class NotLeading(ApplicationError):
    """This server does not lead (or can no longer be sure it does): the command was not sent.

    Raised by ``command_epoch`` with words that name the leader when one is
    known ("serverA no longer leads: serverB at wss://b:7443/ does (epoch
    12); run the command there"); the caller, in process or over the link,
    hears them as ``llmgw.error.refused``.
    """

    def __init__(self, words: str):
        super().__init__(uris.ERROR_REFUSED, words)

    @property
    def words(self) -> str:
        return self.args[0]


def no_ha() -> None:
    """``command_epoch`` without ``ha:``: no epoch, and nothing to fence."""
    return None


def epoch_from(value: Any, where: str) -> int | None:
    """*value*, an epoch another process sent (None: it sent none), or ``ValueError`` naming *where* and why."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MOST:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:39] + "…"
        raise ValueError(f"{where}: an epoch is a whole number from 1 to {MOST} (the leader's election "
                         f"revision in etcd), not {shown}")
    return value


def epoch_keyword(epoch: int | None, fencing: bool | None) -> dict[str, int]:
    """The keyword a command carries: ``{"epoch": N}``, or none without ``ha:`` or for an agent older than fencing.

    *fencing* is what the node said when it registered (``Inventory.fencing``);
    an agent that did not say so refuses any keyword its procedures do not
    take, so it is sent none (and cannot be fenced: upgrade it).
    """
    if epoch is None or not fencing:
        return {}
    return {uris.EPOCH: epoch}
