"""The node's side of fencing: the newest leader's epoch it has seen, kept on disk, and older leaders refused.

With server.yaml's ``ha:`` every command that changes this node carries
``epoch=N`` (``llmgw.ha.fence``), and the leader's register answer says its
epoch too.  The newest epoch heard is kept in the state directory (file
``epoch``, written whole by ``llmgw.durable``) before the command that
raised it runs, so a restarted agent still refuses a leader that no longer
leads.  A command of an older epoch is refused in words, logged once per
epoch; a command with no epoch is run (a server without ``ha:`` has
nothing to fence).

Registering is where a node learns whom to follow: a standby's refusal
(``llmgw.error.standby``), or a server answering with an epoch older than
one this node has seen, ends the session, and the dialler goes on to the
leader it names or to the next hub (``llmgw.link.hubs``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from autobahn.wamp.exception import ApplicationError
from twisted.logger import Logger

from llmgw.durable import write_file
from llmgw.ha.fence import epoch_from
from llmgw.link import uris

log = Logger()

#: The procedures that change the node, and so carry the leader's epoch.
FENCED = frozenset({uris.NODE_START_SHARD, uris.NODE_STOP_SHARD, uris.NODE_DRAIN_SHARD, uris.NODE_CORDON,
                    uris.NODE_COLLECT_WEIGHTS, uris.NODE_SET_ENGINES})
EPOCH_FILE = "epoch"
# Older epochs whose refusal was logged; forgotten all at once past this, so an old leader still writes little.
_LOGGED_MOST = 64


class Fence:
    """The newest epoch this node has seen (None: never one), kept in *state_dir*."""

    def __init__(self, state_dir: str | Path):
        self.path = Path(state_dir) / EPOCH_FILE
        self.seen: int | None = self._read()
        self._logged: set[int] = set()

    def _read(self) -> int | None:
        try:
            text = self.path.read_text("ascii").strip()
            return epoch_from(int(text), str(self.path))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, UnicodeError) as e:
            log.error("cannot read the newest leader's epoch from {path} ({e}); until a leader names one this node "
                      "takes commands of any epoch: check the disk, or remove the file", path=self.path, e=e)
            return None

    def saw(self, epoch: int | None, where: str) -> bool:
        """Note *epoch*, heard in *where*; False when it is older than one seen (the sender no longer leads)."""
        if epoch is None or epoch == self.seen:
            return True
        if self.seen is not None and epoch < self.seen:
            return False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_file(self.path, f"{epoch}\n".encode("ascii"), private=False, replace=True)
        except OSError as e:
            log.error("cannot keep the leader's epoch {epoch} in {path} ({e}): this node refuses older leaders "
                      "until it restarts, not after", epoch=epoch, path=self.path, e=e)
        log.info("the leader's epoch is {epoch} ({where}); commands of older epochs are refused from now on",
                 epoch=epoch, where=where)
        self.seen = epoch
        return True

    def refusal(self, epoch: int) -> str:
        return (f"refused a command of epoch {epoch}: this node has seen epoch {self.seen} (a newer leader); "
                "the server that sent it no longer leads")

    def check(self, procedure: str, epoch: Any) -> None:
        """Refuse (``ApplicationError``) a command to *procedure* of an epoch older than the newest seen."""
        try:
            epoch = epoch_from(epoch, f"{procedure}'s epoch")
        except ValueError as e:
            raise ApplicationError(uris.ERROR_INVALID_ARGUMENT, str(e)) from None
        if self.saw(epoch, procedure):
            return
        words = self.refusal(epoch)
        if epoch not in self._logged:
            if len(self._logged) >= _LOGGED_MOST:
                self._logged.clear()
            self._logged.add(epoch)
            log.warn("{procedure}: {words}", procedure=procedure, words=words)
        raise ApplicationError(uris.ERROR_REFUSED, words)

    def guarded(self, verb: str, procedure: str, fn: Callable) -> Callable:
        """*fn*, the node's procedure *verb* (at *procedure*), taking the keyword ``epoch`` when it changes the node.

        The epoch is checked, and taken off, before *fn* or its argument
        check sees the call; the procedures that change nothing (ping,
        logs) take no epoch.
        """
        if verb not in FENCED:
            return fn

        def answer(*args, **kwargs):
            self.check(procedure, kwargs.pop(uris.EPOCH, None))
            return fn(*args, **kwargs)

        return answer


async def register(session, hubs, fence: Fence, inventory) -> Any:
    """*session*'s call to register (with *inventory*, on the wire); None when the server there does not lead.

    A standby's refusal, or an answer of an epoch older than *fence* has
    seen, is told to *hubs* (``llmgw.link.hubs.HubList``) and the session
    leaves, so the dialler goes to the leader or the next hub.
    """
    hub = hubs.current.url
    try:
        answer = await session.call(uris.AGENT_REGISTER, inventory)
    except ApplicationError as e:
        if e.error != uris.ERROR_STANDBY:
            raise
        hubs.standby(e.args[0] if e.args else None, (e.kwargs or {}).get(uris.LEADER_URL))
        session.leave()
        return None
    try:
        epoch = epoch_from(answer.get(uris.EPOCH) if isinstance(answer, dict) else None, "the register answer")
    except ValueError as e:
        log.error("{hub}: {e}; this node goes on as if it named none", hub=hub, e=e)
        epoch = None
    if not fence.saw(epoch, f"registered at {hub}"):
        hubs.standby(f"it answered as the leader of epoch {epoch}, but this node has seen epoch {fence.seen}: "
                     "it no longer leads")
        session.leave()
        return None
    hubs.settled()
    return answer
