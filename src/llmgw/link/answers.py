"""What a caller hears from a procedure answered in process: its arguments checked, its failures in llmgw's words.

The in-process control plane answers most of the hub's procedures.  A call
whose arguments do not fit the procedure (too few, too many, a keyword it
does not take) used to reach the handler and come back as Python's own
sentence ("agent_register() missing 1 required positional argument"); a
handler that failed on its own (a ``KeyError``) sent the caller Python's
exception text.  Here the hub checks a call against the handler's signature
before anything runs and refuses it with ``wamp.error.invalid_argument`` in
a sentence that names the procedure and what it takes; and a failure that
is not an ``ApplicationError`` or one of llmgw's own errors reaches the
caller as one sentence saying it was the server's fault, while the
server's log keeps the traceback (the session's ``onUserError``).

A remote callee (an agent) answers by the same rule on its own side
(``checked`` and ``worded_errors`` with its own sentences): the hub passes
its answer on as it came, and a server of another version, or an operator
reading a relayed refusal, hears llmgw's words, never Python's.
"""

from __future__ import annotations

import functools
import inspect
from typing import Callable

import attrs
from autobahn.wamp import message
from autobahn.wamp.exception import ApplicationError
from twisted.python.failure import Failure

from llmgw.errors import LlmgwError
from llmgw.link import uris
from llmgw.pki.subject import printable

# A caller's keyword names are its own text: at most this many, each at most this long, reach the refusal.
_NAMES_SHOWN = 5
_NAME_CHARS = 40

SERVER_FAULT = ("the server failed while answering this call (its fault, not the caller's); "
                "the server's log has the details: tell its operator")
#: What a caller whose arguments do not fit is told to check.
SAME_VERSION = "check that this client and the server run the same llmgw version"


@attrs.frozen
class DirectCallDetails:
    """What a directly answered procedure is told of its caller: the fields of autobahn's ``CallDetails`` it reads."""

    caller: int | None
    caller_authid: str | None
    caller_authrole: str | None
    procedure: str


def argument_refusal(procedure: str, fn: Callable, args, kwargs, details_arg: str | None = None,
                     advice: str = SAME_VERSION) -> str | None:
    """Why *fn* cannot be called with *args* and *kwargs* for *procedure*, in words; None when it can.

    *details_arg* is the keyword the handler is given the call's details by:
    not the caller's to send.  *advice* ends the sentence: what to check.
    """
    try:
        signature = _signature(fn, details_arg)
    except TypeError:  # a handler that cannot be hashed: not remembered
        signature = _signature.__wrapped__(fn, details_arg)
    return _refusal(procedure, signature, args, kwargs, details_arg, advice)


def _refusal(procedure: str, signature: inspect.Signature | None, args, kwargs, details_arg: str | None,
             advice: str) -> str | None:
    if signature is None:
        return None  # a builtin without one: the handler judges for itself
    params = list(signature.parameters.values())
    args = list(args or ())
    kwargs = dict(kwargs or {})
    if details_arg is not None and details_arg in kwargs:
        return f"{procedure} was sent the keyword argument {details_arg!r}, which the hub fills in; leave it out"
    try:
        signature.bind(*args, **kwargs)
        return None
    except TypeError:
        pass
    return f"{procedure} takes {_takes(params)}; it was sent {_sent(args, kwargs)}: {advice}"


def checked(procedure: str, fn: Callable, advice: str = SAME_VERSION) -> Callable:
    """*fn* as a callee over the link registers it: a call that does not fit is refused before *fn* runs.

    The refusal is ``argument_refusal``'s sentence, ending in *advice*, as
    ``wamp.error.invalid_argument``: the caller's mistake, not the callee's.
    The signature is read once, here (a callee's procedures are few and
    called seldom, so every call is checked, not only one that fails).
    """
    signature = _signature.__wrapped__(fn, None)

    def answer(*args, **kwargs):
        refused = _refusal(procedure, signature, args, kwargs, None, advice)
        if refused is not None:
            raise ApplicationError(uris.ERROR_INVALID_ARGUMENT, refused)
        return fn(*args, **kwargs)

    return answer


@functools.lru_cache(maxsize=256)
def _signature(fn: Callable, details_arg: str | None) -> inspect.Signature | None:
    """*fn*'s signature less its *details_arg*; made once per handler (a node registers, then beats for days)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    return signature.replace(parameters=[p for p in signature.parameters.values() if p.name != details_arg])


def _count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def _takes(params: list[inspect.Parameter]) -> str:
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p.name for p in positional if p.default is p.empty]
    optional = [p.name for p in positional if p.default is not p.empty]
    keywords = [p.name for p in params if p.kind is p.KEYWORD_ONLY]
    parts = []
    if required:
        parts.append(f"{_count(len(required), 'argument')} ({', '.join(required)})")
    if optional:
        parts.append(f"up to {len(optional) if required else _count(len(optional), 'argument')} "
                     f"{'more ' if required else ''}({', '.join(optional)})")
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        parts.append("any number of further arguments")
    if any(p.kind is p.VAR_KEYWORD for p in params):
        parts.append("any keyword arguments")
    elif keywords:
        parts.append(f"the keyword {'argument' if len(keywords) == 1 else 'arguments'} {', '.join(keywords)}")
    if not parts:
        return "no arguments"
    return parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} and {parts[-1]}"


def _sent(args: list, kwargs: dict) -> str:
    said = _count(len(args), "argument") if args else "no arguments"
    if kwargs:
        names = [printable(str(k)[:_NAME_CHARS]) for k in list(kwargs)[:_NAMES_SHOWN]]
        more = f" and {len(kwargs) - _NAMES_SHOWN} more" if len(kwargs) > _NAMES_SHOWN else ""
        said += f" and the keyword {'argument' if len(kwargs) == 1 else 'arguments'} {', '.join(names)}{more}"
    return said


def worded(exc: BaseException, fault: str = SERVER_FAULT) -> ApplicationError:
    """*exc* as the caller hears it: an ``ApplicationError`` as it is, llmgw's own error in its words, else *fault*."""
    if isinstance(exc, ApplicationError):
        return exc
    if isinstance(exc, LlmgwError):
        return ApplicationError(uris.ERROR_RUNTIME, str(exc))
    return ApplicationError(uris.ERROR_RUNTIME, fault)


def worded_errors(app_session, fault: str = SERVER_FAULT):
    """*app_session*, its ERROR answers made by ``worded`` (saying *fault* for a failure of its own), never with a traceback.

    The hub's in-process sessions and an agent's session over the link alike.
    """
    made = app_session._message_from_exception

    def message_from_exception(request_type, request, exc, tb=None, enc_algo=None):
        return made(request_type, request, worded(exc, fault), None, enc_algo)

    app_session._message_from_exception = message_from_exception
    app_session.traceback_app = False
    return app_session


# autobahn's callee words an answer it made but could not send in Python's (the answer's repr and the
# serializer's exception), under URIs autobahn's caller raises as exceptions that are no ApplicationError:
# the error llmgw answers instead, and what it means.
_UNSENDABLE = {
    ApplicationError.INVALID_PAYLOAD: (uris.ERROR_RUNTIME, "it holds text the link cannot carry (not UTF-8)"),
    ApplicationError.PAYLOAD_SIZE_EXCEEDED: (uris.ERROR_LIMIT,
                                             "it is larger than the 16 MiB a link message may be; ask for less"),
}


class _WordedTransport:
    """A callee's transport: an ERROR saying its answer could not be sent goes in llmgw's words; all else as it is."""

    def __init__(self, transport, who: str):
        self._transport = transport
        self._who = who

    def send(self, msg) -> None:
        if (isinstance(msg, message.Error) and msg.request_type == message.Invocation.MESSAGE_TYPE
                and msg.error in _UNSENDABLE):
            error, why = _UNSENDABLE[msg.error]
            msg = message.Error(msg.request_type, msg.request, error, args=[
                f"{self._who} could not send its answer to this call: {why}; its log has the details"])
        self._transport.send(msg)

    def __getattr__(self, name):
        return getattr(self._transport, name)


def worded_unsendable(app_session, who: str):
    """*app_session*, a callee over the link, telling its caller in words when its answer could not be sent.

    *who* names the callee ("node01's agent").  What the serializer or the
    link refused is logged by autobahn where the callee runs.
    """
    opened = app_session.onOpen

    def onOpen(transport):
        return opened(_WordedTransport(transport, who))

    app_session.onOpen = onOpen
    return app_session


def local_refusal(app_session, registration: int, procedure: str, args, kwargs) -> str | None:
    """Why the in-process *app_session*'s handler of *registration* cannot take *args* and *kwargs*; None when it can."""
    held = getattr(app_session, "_registrations", {}).get(registration)
    endpoint = getattr(held, "endpoint", None)
    if endpoint is None:
        return None
    fn = endpoint.fn if endpoint.obj is None else endpoint.fn.__get__(endpoint.obj)
    return argument_refusal(procedure, fn, args, kwargs, endpoint.details_arg)


def answer_directly(session, msg, app_session, procedures: dict[str, Callable]):
    """The in-process session's answer, or its refusal, as its YIELD or ERROR would have carried it; the message to send."""
    fn = procedures[msg.procedure]
    details = DirectCallDetails(session.session_id, session.authid, session.role, msg.procedure)
    try:
        result = fn(*(msg.args or ()), **(msg.kwargs or {}), details=details)
    except Exception as e:
        # Arguments that do not bind fail before the handler runs: the
        # caller's mistake, answered and not logged.  Checked only then, so a
        # heartbeat that fits pays nothing for it.
        refused = argument_refusal(msg.procedure, fn, msg.args, msg.kwargs, "details") if isinstance(e, TypeError) else None
        if refused is not None:
            return message.Error(message.Call.MESSAGE_TYPE, msg.request, uris.ERROR_INVALID_ARGUMENT, args=[refused])
        # As autobahn's callee does: the session hears of it (and logs it
        # as it chooses), the caller gets the error's URI and words.
        app_session.onUserError(Failure(), f"{msg.procedure}: {e}")
        error = worded(e)
        return message.Error(message.Call.MESSAGE_TYPE, msg.request, error.error, args=list(error.args),
                             kwargs=error.kwargs or None)
    return message.Result(msg.request, args=[result])
