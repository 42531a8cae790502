"""The hub's dealer: who answers each procedure, and the calls on their way to it.

The Basic Profile's REGISTER/CALL/INVOCATION/YIELD/ERROR with the Advanced
Profile features llmgw's parts use: call timeouts, call canceling (skip,
kill, killnowait; a callee that did not announce call_canceling is never
interrupted), progressive results and caller identification.  The caller is
always disclosed to the callee, so the control plane reads who is asking
from the call details.  The procedures an in-process session names as
direct (the heartbeat, every few seconds from every node) are answered by
calling straight in, with no INVOCATION and YIELD between them.

The hub (``llmgw.link.hub``) owns the sessions and hands the dealer each
message of an open one; it decides who may do what (*refused*).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import attrs
from autobahn.wamp import message
from twisted.logger import Logger

from llmgw.link import answers, authz, inbound, uris

if TYPE_CHECKING:
    from llmgw.link.peer import HubSession

log = Logger()

SKIP, KILL, KILLNOWAIT = message.Cancel.SKIP, message.Cancel.KILL, message.Cancel.KILLNOWAIT

#: ``refused(session, action, uri, request_type, request, answer=True)``: True when the
#: session may not, after it was told why (``Hub._refused``).
Refuser = Callable[..., bool]


@attrs.define(eq=False)
class _Registration:
    id: int
    uri: str
    callee: HubSession


@attrs.define(eq=False)
class _Invocation:
    id: int
    caller: HubSession
    call_request: int
    callee: HubSession
    procedure: str
    timeout: object | None = None
    interrupted: bool = False


class Dealer:
    """The registrations and the invocations in flight, for every session of one hub."""

    def __init__(self, clock, refused: Refuser, new_id: Callable[[], int]):
        self._clock = clock
        self._refused = refused
        self._new_id = new_id  # router-scope ids, shared with the broker's subscriptions
        self._registrations: dict[str, _Registration] = {}
        self._registrations_by_id: dict[int, _Registration] = {}
        # By (callee, invocation id) and by (caller, call request id).
        self.invocations: dict[tuple[HubSession, int], _Invocation] = {}
        self._calls: dict[tuple[HubSession, int], _Invocation] = {}
        # Per in-process session: itself and the procedures it answers directly.
        self._direct: dict[HubSession, tuple[object, dict[str, Callable]]] = {}
        # Every in-process session's autobahn side: a call's arguments are checked against its handler first.
        self._local: dict[HubSession, object] = {}

    def attach_local(self, hub_side: HubSession, app_session) -> None:
        direct = getattr(app_session, "direct_procedures", None)
        if direct is not None:
            # Called with the caller's args and kwargs and details=, synchronously;
            # used only while this session holds the procedure's registration.
            self._direct[hub_side] = (app_session, dict(direct()))
        self._local[hub_side] = app_session

    def detach(self, session: HubSession) -> None:
        """*session* is gone before or without joining: forget what ``attach_local`` kept of it."""
        self._direct.pop(session, None)
        self._local.pop(session, None)

    def session_left(self, session: HubSession) -> None:
        """*session* left: its registrations go, and every call it made or was answering ends."""
        for reg in [r for r in self._registrations.values() if r.callee is session]:
            self._drop_registration(reg)
        for inv in [i for i in self.invocations.values() if session in (i.caller, i.callee)]:
            self._end_invocation(inv)
            if inv.callee is session:
                inv.caller.send(
                    message.Error(message.Call.MESSAGE_TYPE, inv.call_request, "wamp.error.canceled",
                                  args=[f"{session.authid} went away before answering"])
                )
            elif inv.callee.cancellable:
                inv.callee.send(message.Interrupt(inv.id, KILLNOWAIT))

    def answer_refused(self, session: HubSession, refused: inbound.MessageRefused) -> None:
        """*session*'s YIELD or ERROR was refused unread: its caller hears why, not "went away"."""
        if refused.kind not in (message.Yield.MESSAGE_TYPE, message.Error.MESSAGE_TYPE) or refused.request is None:
            return
        inv = self.invocations.get((session, refused.request))
        if inv is not None:
            self._end_invocation(inv)
            inv.caller.send(message.Error(message.Call.MESSAGE_TYPE, inv.call_request, refused.error,
                                          args=[f"the answer of {session.authid} was refused: {refused.why}"]))

    # -- registrations --

    def on_register(self, session: HubSession, msg) -> None:
        if self._refused(session, authz.REGISTER, msg.procedure, message.Register.MESSAGE_TYPE, msg.request):
            return
        if msg.match not in (None, "exact"):
            session.send(message.Error(message.Register.MESSAGE_TYPE, msg.request, "wamp.error.invalid_argument",
                                       args=["this hub registers exact URIs only"]))
            return
        if msg.procedure in self._registrations:
            holder = self._registrations[msg.procedure].callee
            session.send(message.Error(message.Register.MESSAGE_TYPE, msg.request, "wamp.error.procedure_already_exists",
                                       args=[f"{msg.procedure} is registered by {holder.role} {holder.authid}"]))
            return
        reg = _Registration(self._new_id(), msg.procedure, session)
        self._registrations[reg.uri] = reg
        self._registrations_by_id[reg.id] = reg
        session.send(message.Registered(msg.request, reg.id))

    def on_unregister(self, session: HubSession, msg) -> None:
        reg = self._registrations_by_id.get(msg.registration)
        if reg is None or reg.callee is not session:
            session.send(message.Error(message.Unregister.MESSAGE_TYPE, msg.request, "wamp.error.no_such_registration",
                                       args=[f"this session holds no registration {msg.registration}"]))
            return
        self._drop_registration(reg)
        session.send(message.Unregistered(msg.request))

    def callee(self, procedure: str) -> HubSession | None:
        """The session that answers *procedure*; None when none has registered it."""
        reg = self._registrations.get(procedure)
        return reg.callee if reg is not None else None

    def _drop_registration(self, reg: _Registration) -> None:
        self._registrations.pop(reg.uri, None)
        self._registrations_by_id.pop(reg.id, None)

    # -- calls --

    def on_call(self, session: HubSession, msg) -> None:
        if self._refused(session, authz.CALL, msg.procedure, message.Call.MESSAGE_TYPE, msg.request):
            return
        reg = self._registrations.get(msg.procedure)
        if reg is None:
            session.send(message.Error(message.Call.MESSAGE_TYPE, msg.request, "wamp.error.no_such_procedure",
                                       args=[f"nothing is registered at {msg.procedure}"]))
            return
        callee = reg.callee
        direct = self._direct.get(callee) if self._direct else None
        if direct is not None and msg.procedure in direct[1]:
            session.send(answers.answer_directly(session, msg, *direct))
            return
        local = self._local.get(callee)
        refused = answers.local_refusal(local, reg.id, msg.procedure, msg.args, msg.kwargs) if local else None
        if refused is not None:
            session.send(message.Error(message.Call.MESSAGE_TYPE, msg.request, uris.ERROR_INVALID_ARGUMENT, args=[refused]))
            return
        inv = _Invocation(callee.next_invocation_id(), session, msg.request, callee, msg.procedure)
        self.invocations[(callee, inv.id)] = inv
        self._calls[(session, msg.request)] = inv
        if msg.timeout:
            inv.timeout = self._clock.callLater(msg.timeout / 1000.0, self._timed_out, inv)
        callee.send(
            message.Invocation(
                inv.id, reg.id, args=msg.args, kwargs=msg.kwargs, timeout=msg.timeout,
                receive_progress=msg.receive_progress,
                caller=session.session_id, caller_authid=session.authid, caller_authrole=session.role,
                procedure=msg.procedure,
            )
        )

    def _timed_out(self, inv: _Invocation) -> None:
        inv.timeout = None
        if self.invocations.get((inv.callee, inv.id)) is not inv:
            return
        self._end_invocation(inv)
        # Advanced Profile, "Call Timeouts": killnowait for a callee that cancels, else skip.
        if inv.callee.cancellable:
            inv.callee.send(message.Interrupt(inv.id, KILLNOWAIT, reason="wamp.error.timeout"))
        log.info("call to {uri} from {caller} timed out; {callee} did not answer", uri=inv.procedure,
                 caller=inv.caller.authid, callee=inv.callee.authid)
        inv.caller.send(message.Error(message.Call.MESSAGE_TYPE, inv.call_request, "wamp.error.timeout",
                                      args=[f"{inv.callee.authid} did not answer in time"]))

    def _end_invocation(self, inv: _Invocation) -> None:
        self.invocations.pop((inv.callee, inv.id), None)
        self._calls.pop((inv.caller, inv.call_request), None)
        if inv.timeout is not None and inv.timeout.active():
            inv.timeout.cancel()
        inv.timeout = None

    def on_cancel(self, session: HubSession, msg) -> None:
        """Advanced Profile, "Call Canceling"; a callee that did not announce it gets skip."""
        inv = self._calls.get((session, msg.request))
        if inv is None:
            return  # answered already: there is nothing left to cancel
        mode = msg.mode or KILLNOWAIT
        if not inv.callee.cancellable:
            mode = SKIP
        log.info("call to {uri} from {caller} cancelled ({mode})", uri=inv.procedure, caller=session.authid, mode=mode)
        if mode == KILL:
            # The caller hears whatever the callee answers, RESULT or ERROR.
            if not inv.interrupted:
                inv.interrupted = True
                inv.callee.send(message.Interrupt(inv.id, KILL))
            return
        self._end_invocation(inv)
        if mode == KILLNOWAIT:
            inv.callee.send(message.Interrupt(inv.id, KILLNOWAIT))
        session.send(message.Error(message.Call.MESSAGE_TYPE, msg.request, "wamp.error.canceled",
                                   args=[f"the call to {inv.procedure} was cancelled"]))

    def on_yield(self, session: HubSession, msg) -> None:
        inv = self.invocations.get((session, msg.request))
        if inv is None:
            return  # answered after a timeout or cancel: nobody is waiting
        if not msg.progress:
            self._end_invocation(inv)
        inv.caller.send(message.Result(inv.call_request, args=msg.args, kwargs=msg.kwargs, progress=msg.progress))

    def on_error(self, session: HubSession, msg) -> None:
        if msg.request_type != message.Invocation.MESSAGE_TYPE:
            return
        inv = self.invocations.get((session, msg.request))
        if inv is None:
            return
        self._end_invocation(inv)
        inv.caller.send(message.Error(message.Call.MESSAGE_TYPE, inv.call_request, msg.error, args=msg.args, kwargs=msg.kwargs))
