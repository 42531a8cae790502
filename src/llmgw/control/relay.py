"""What the control plane asks a node for an operator, and what it hands on: checked where the node's answer arrives.

A node's answer to ``llmgw.node.<id>.*`` is another process's word, and
what the control plane relays reaches ctl, the dashboard and the admin
page.  So an answer is read into its record here (``from_wire``), bounded,
and a node that answers something else is reported by name, with what was
wrong, as ``llmgw.error.not_answering``: never the node's bytes passed on,
never a traceback where the answer is read.  A node's refusal is relayed
as its words, cut to ``ERROR_CHARS`` and with its control characters
escaped, under the node's name.
"""

from __future__ import annotations

from typing import Any, TypeVar

import attrs
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import CallOptions
from twisted.logger import Logger

from llmgw.answers import LOG_LINES, LogsAnswer
from llmgw.ha.fence import NotLeading, epoch_keyword
from llmgw.link import uris
from llmgw.text import printable
from llmgw.wire import WireError, from_wire

T = TypeVar("T")
log = Logger()

#: How much of a node's refusal or of what was wrong with its answer an operator is shown.
ERROR_CHARS = 500
#: The most bytes of log lines one ``llmgw.cp.logs`` answer relays; the oldest lines go first.
LOG_BYTES = 4 * 2**20
#: How long a node may take to send its logs before the operator is told it is not answering.
LOGS_TIMEOUT_MS = 10_000
# What the link says when the node was not there to answer, or not in time.
_SILENT = frozenset({"wamp.error.timeout", "wamp.error.no_such_procedure", "wamp.error.canceled"})
# A node's refusals that mean what they say to an operator; any other error a node raises is a refusal.
_RELAYED = frozenset({uris.ERROR_REFUSED, uris.ERROR_INVALID_ARGUMENT})


def words(value: Any) -> str:
    """*value*, said by a node, as one bounded line an operator may read."""
    text = printable(value if isinstance(value, str) else repr(value))
    return text if len(text) <= ERROR_CHARS else text[: ERROR_CHARS - 1] + "…"


def failure_words(failure) -> str:
    """Why a call to a node failed: a refusal's own words (its first argument), else the exception's."""
    value = getattr(failure, "value", failure)
    args = getattr(value, "args", ())
    if getattr(value, "error", None) and args:
        return str(args[0])
    return str(value) or type(value).__name__


def answer(node_id: str, verb: str, cls: type[T], payload: Any) -> T:
    """*payload*, the node's answer to *verb*, as a *cls*; or the operator is told which node answered what."""
    try:
        return from_wire(cls, payload)
    except WireError as e:
        raise ApplicationError(
            uris.ERROR_NOT_ANSWERING,
            f"{node_id} answered {verb} with something llmgw cannot read ({words(str(e))}); "
            f"is its agent a much older or newer llmgw? `llmgw ctl nodes --json` shows its agent_version",
        ) from None


def fenced(session, node_id: str) -> dict[str, int]:
    """The keyword a command that changes *node_id* carries: the leader's epoch, when there is one to send.

    ``session.command_epoch()`` gives it (None without ``ha:``); when it
    raises ``NotLeading`` the command is not sent and the caller hears its
    words.  A node that did not say it checks epochs (an agent older than
    fencing) is sent none: it would refuse the keyword.
    """
    node = session.fleet.nodes.get(node_id)
    return epoch_keyword(session.command_epoch(), node is not None and node.inventory.fencing)


def register_epoch(session, node_id: str, fencing: bool | None) -> int | None:
    """The epoch a register answer tells *node_id*: None without ``ha:``, or while this server cannot command."""
    try:
        epoch = session.command_epoch()
    except NotLeading:
        return None
    if epoch is not None and not fencing:
        log.warn("{node}'s agent is older than fencing: it is sent commands without the leader's epoch, so a server "
                 "that lost the lead could still command it; upgrade its llmgw", node=node_id)
    return epoch


async def ask(session, node_id: str, verb: str, *args: Any, timeout_ms: int, fence: bool = False) -> Any:
    """Call *verb* on *node_id* for an operator; a silent node, or a node's refusal, named as that node's.

    *fence*: the call changes the node, so it carries the leader's epoch (``fenced``).
    """
    kwargs = fenced(session, node_id) if fence else {}
    try:
        return await session.call(uris.node_uri(node_id, verb), *args, options=CallOptions(timeout=timeout_ms),
                                  **kwargs)
    except ApplicationError as e:
        said = words(e.args[0]) if e.args else e.error
        if e.error in _SILENT:
            raise ApplicationError(uris.ERROR_NOT_ANSWERING, f"{node_id}: agent too old or not answering ({said})") \
                from None
        raise ApplicationError(e.error if e.error in _RELAYED else uris.ERROR_REFUSED, f"{node_id}: {said}") from None


def lines_asked(n: Any) -> int:
    """The operator's *n*: a number of lines, 0 or more, of which ``LOG_LINES`` at most are asked (as the agent caps it)."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ApplicationError(uris.ERROR_INVALID_ARGUMENT,
                               f"llmgw.cp.logs: n is a number of lines, 0 or more (at most {LOG_LINES} are sent), "
                               f"not {words(n)}")
    return min(n, LOG_LINES)


def logs(node_id: str, payload: Any, n: int) -> LogsAnswer:
    """The node's answer to ``logs`` as a ``LogsAnswer``: its own name, at most *n* lines and ``LOG_BYTES`` of them."""
    got = answer(node_id, uris.NODE_LOGS, LogsAnswer, payload)
    lines = got.lines[len(got.lines) - n:] if n else []
    size, start = 0, len(lines)
    while start and size + len(lines[start - 1].encode("utf-8", "replace")) + 1 <= LOG_BYTES:
        start -= 1
        size += len(lines[start].encode("utf-8", "replace")) + 1
    return attrs.evolve(got, node=node_id, lines=lines[start:])
