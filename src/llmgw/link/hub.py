"""The hub: a small WAMP router embedded in the server.

The Basic Profile — HELLO/WELCOME/ABORT/GOODBYE, REGISTER/CALL/INVOCATION/
YIELD/ERROR, SUBSCRIBE/PUBLISH/EVENT — with the Advanced Profile features
llmgw's parts use: call timeouts, call canceling (skip, kill, killnowait;
a callee that did not announce call_canceling is never interrupted),
progressive results, caller identification, prefix subscriptions and
publisher exclusion.  A router we can read end to end is one we can trust
with the fleet.  Frames are parsed in ``llmgw.link.inbound``; one peer is a
``HubSession`` (``llmgw.link.peer``).

Identity is never taken from a client: a remote session's authid and role
come from its TLS client certificate (``identity_of``), and a HELLO that
claims another authid is aborted.  A node identity has one live session:
a second is admitted only if the first does not answer a ping (it is then
closed), and otherwise refused in a sentence naming both peers.  The
caller is always disclosed to the callee, so the control plane reads who
is asking from the call details.  The control plane itself attaches in
process through ``attach_local``; the procedures it names as direct (the
heartbeat, every few seconds from every node) the hub answers by calling
straight in, with no INVOCATION and YIELD between them.

Every limit in ``LinkSettings`` that refuses or ends something counts it
in ``Hub.refusals`` (by limit) and logs one line naming the peer.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Callable

import attrs
from autobahn.twisted.websocket import WampWebSocketServerFactory
from autobahn.wamp import message, role
from twisted.logger import Logger

from llmgw.config.common import verbose_logs
from llmgw.config.server import LinkSettings
from llmgw.errors import PKIError
from llmgw.link import answers, authz, inbound, uris
from llmgw.link.local import LocalLink
from llmgw.link.peer import HubProtocol, HubSession, SessionIdentity
from llmgw.link.session import LinkJsonSerializer, quiet_cancellations, sweep_pings
from llmgw.link.tls import SessionRefusal, refused_session

log = Logger()

# Session and publication ids are global-scope ids (Basic Profile, "IDs"):
# drawn at random from [1, 2^53].  Registrations and subscriptions are
# router-scope and may count.  A session id is drawn from the system's
# generator; a publication id, one per event, from Python's own (seeded from
# the system's), which takes no system call: 1 % of the server at 5,000
# nodes.  Nothing is authorised by either.
MAX_ID = 2**53
_random = random.SystemRandom()
_publications = random.Random()

META_ON_JOIN = "wamp.session.on_join"
META_ON_LEAVE = "wamp.session.on_leave"

_ROUTER_ROLES = {
    "broker": role.RoleBrokerFeatures(pattern_based_subscription=True, publisher_exclusion=True),
    "dealer": role.RoleDealerFeatures(
        caller_identification=True, call_canceling=True, call_timeout=True, progressive_call_results=True
    ),
}

SKIP, KILL, KILLNOWAIT = message.Cancel.SKIP, message.Cancel.KILL, message.Cancel.KILLNOWAIT
_LOGGED_CHARS = 500  # of a refusal's sentence in the log


@attrs.frozen
class DuplicateSession:
    """A second session for a connected node, refused because the first answered its ping.

    ``count`` is how many were refused for this node since the hub started;
    ``at`` is the hub clock's time of the latest.  ``ctl nodes`` warns with it.
    """

    node_id: str
    holder_peer: str
    refused_peer: str
    count: int
    at: float

    @property
    def sentence(self) -> str:
        return (
            f"{self.node_id} is already connected from {self.holder_peer}; a second agent with its certificate "
            f"from {self.refused_peer} was refused: give each node its own certificate"
        )


@attrs.define(eq=False)
class _Registration:
    id: int
    uri: str
    callee: HubSession


@attrs.define(eq=False)
class _Subscription:
    id: int
    topic: str
    match: str
    subscribers: set = attrs.Factory(set)


@attrs.define(eq=False)
class _Invocation:
    id: int
    caller: HubSession
    call_request: int
    callee: HubSession
    procedure: str
    timeout: object | None = None
    interrupted: bool = False


class Hub:
    def __init__(self, clock, realm: str = uris.REALM, identify: Callable | None = None,
                 settings: LinkSettings | None = None):
        self.realm = realm
        self._clock = clock
        self._identify = identify
        self.settings = settings or LinkSettings()
        self.sessions: dict[int, HubSession] = {}
        self.sessions_left = 0  # sessions that have left since the hub started
        self._registrations: dict[str, _Registration] = {}
        self._registrations_by_id: dict[int, _Registration] = {}
        self._exact: dict[str, _Subscription] = {}
        self._prefix: dict[str, _Subscription] = {}
        self._subscriptions_by_id: dict[int, _Subscription] = {}
        self._invocations: dict[tuple[HubSession, int], _Invocation] = {}
        self._calls: dict[tuple[HubSession, int], _Invocation] = {}
        self._router_ids = 0
        # One live session per node identity, and the newcomers waiting on a liveness check.
        self._nodes: dict[str, HubSession] = {}
        self._checking: set[str] = set()
        # What each limit refused or ended, by its name; and the duplicates by node.
        self.refusals: Counter[str] = Counter()
        self.duplicates: dict[str, DuplicateSession] = {}
        self.duplicate_listeners: list[Callable[[DuplicateSession], None]] = []
        # Told of each remote session's transport once it is welcomed: its handshakes are done
        # (the link's ConnectionBudget paces arrivals by it).
        self.admitted: Callable[[object], None] | None = None
        # Per in-process session: itself and the procedures it answers directly (``attach_local``).
        self._direct: dict[HubSession, tuple[object, dict[str, Callable]]] = {}
        # Every in-process session's autobahn side: a call's arguments are checked against its handler first.
        self._local: dict[HubSession, object] = {}

    # -- attaching sessions --

    def websocket_factory(self, url: str | None = None) -> WampWebSocketServerFactory:
        # No Server header and no status page: the port names no software or version (HubProtocol.failHandshake).
        factory = WampWebSocketServerFactory(lambda: HubSession(self), url=url, serializers=[LinkJsonSerializer()],
                                             server=None)
        factory.protocol = HubProtocol
        factory.noisy = verbose_logs()
        # A half-open connection (a node that lost power) is found by pings,
        # not by waiting for TCP to notice.  The opening handshake (TLS, then
        # WebSocket) has the HELLO timeout too; HELLO has it again from there.
        factory.setProtocolOptions(
            maxMessagePayloadSize=16 * 1024 * 1024,
            maxFramePayloadSize=16 * 1024 * 1024,
            autoPingInterval=10,
            autoPingTimeout=20,
            openHandshakeTimeout=self.settings.hello_timeout_s,
            webStatus=False,
        )
        sweep_pings(factory)
        return factory

    def attach_local(self, app_session, authid: str = "control", role: str = uris.ROLE_CONTROL) -> None:
        """Attach an in-process autobahn session: the control plane, with full rights.

        Tests attach other roles the same way; they are held to the same rules
        as over the network, since authorization looks only at the role.
        """
        hub_side = HubSession(self, SessionIdentity(authid, role))
        direct = getattr(app_session, "direct_procedures", None)
        if direct is not None:
            # Called with the caller's args and kwargs and details=, synchronously;
            # used only while this session holds the procedure's registration.
            self._direct[hub_side] = (app_session, dict(direct()))
        self._local[hub_side] = app_session
        LocalLink(self._clock, hub_side, answers.worded_errors(quiet_cancellations(app_session))).open()

    def _identity_from(self, transport) -> SessionIdentity | SessionRefusal | None:
        """Who the peer's certificate says it is; else why it gets no session (a sentence for its ABORT), or None."""
        tls = getattr(transport, "transport", None)
        refused = refused_session(tls)
        if refused is not None:
            return refused  # its handshake was completed only to tell it this (llmgw.link.tls)
        get = getattr(tls, "getPeerCertificate", None)
        peer = get() if get is not None else None
        if peer is None:
            return None
        if self._identify is None:
            from llmgw.pki.subject import identity_of

            self._identify = identity_of
        try:
            ident = self._identify(peer.to_cryptography())
        except PKIError as e:
            log.warn("refused a client certificate from {peer}: {why}", peer=getattr(transport, "peer", "?"), why=str(e))
            return SessionRefusal("certificate_subject", str(e))
        expires = ident.not_after.timestamp() if ident.not_after is not None else None
        return SessionIdentity(ident.name, ident.role, not_after=expires)

    def _new_id(self) -> int:
        self._router_ids += 1
        return self._router_ids

    # -- opening and closing --

    def _opened(self, session: HubSession) -> None:
        if session.peer != "in process":
            session.hello_timer = self._clock.callLater(self.settings.hello_timeout_s, self._no_hello, session)

    def _no_hello(self, session: HubSession) -> None:
        session.hello_timer = None
        if session.hello_seen or not session.open:
            return
        self.refusals["hello_timeout"] += 1
        log.warn("closed the connection from {peer}: no HELLO within {s} s (link.hello_timeout_s)",
                 peer=session.peer, s=self.settings.hello_timeout_s)
        session.drop()

    def _frame(self, session: HubSession, payload: bytes, is_binary: bool) -> None:
        try:
            msg = inbound.decode(payload, is_binary, self.settings.max_message_depth)
        except inbound.Violation as e:
            self._violation(session, str(e))
            return
        except inbound.MessageRefused as refused:
            self._refuse_message(session, refused)
            return
        session.onMessage(msg)

    def _refuse_message(self, session: HubSession, refused: inbound.MessageRefused) -> None:
        if refused.kind in (message.Yield.MESSAGE_TYPE, message.Error.MESSAGE_TYPE) and refused.request is not None:
            inv = self._own_invocation(session, refused.request)  # its caller hears why, not "went away"
            if inv is not None:
                self._end_invocation(inv)
                inv.caller.send(message.Error(message.Call.MESSAGE_TYPE, inv.call_request, refused.error,
                                              args=[f"the answer of {session.authid} was refused: {refused.why}"]))
        if session.session_id is None or refused.error == inbound.ERROR_INVALID_ARGUMENT:
            # Nested past the limit: no message llmgw's parts send, so it
            # ends the session as other violations do.  A malformed URI is
            # the Basic Profile's ERROR, and the session goes on.
            self._violation(session, refused.why, "message_depth" if session.session_id is not None else None)
            return
        self.refusals["invalid_uri"] += 1
        log.warn("refused a message from {s}: {why}", s=session, why=refused.why)
        if refused.answer:
            session.send(refused.reply())

    def _hello(self, session: HubSession, msg) -> None:
        if session.hello_timer is not None and session.hello_timer.active():
            session.hello_timer.cancel()
        session.hello_timer = None
        if session.hello_seen:
            self._violation(session, f"{type(msg).__name__.upper()} before WELCOME")
            return
        session.hello_seen = True
        if not isinstance(msg, message.Hello):
            self._violation(session, f"expected HELLO, got {type(msg).__name__.upper()}")
            return
        ident = session._identity
        if ident is None:  # its certificate was judged, and refused, when its connection opened: counted now
            why = session.refusal or SessionRefusal("no_certificate", "no valid client certificate from the cluster CA")
            self._abort(session, uris.ERROR_NOT_AUTHORIZED, why.sentence, why.kind)
            return
        if msg.realm != self.realm:
            self._refuse_hello(session, "wamp.error.no_such_realm", "no_such_realm",
                               f"no realm {msg.realm[:100]!r}; the realm is {self.realm!r}")
            return
        if msg.authid is not None and msg.authid != ident.authid:  # the claim is its own text: escaped
            self._refuse_hello(session, uris.ERROR_NOT_AUTHORIZED, "authid_mismatch",
                               f"the client certificate is for {ident.authid!r}, the HELLO claims {msg.authid[:100]!r}")
            return
        if ident.role != uris.ROLE_CONTROL and (refused := authz.session_refusal(ident.role, ident.authid)):
            self._refuse_hello(session, uris.ERROR_NOT_AUTHORIZED, "certificate_subject", refused)
            return
        callee = (msg.roles or {}).get("callee")
        session.cancellable = bool(getattr(callee, "call_canceling", False))
        if ident.role == uris.ROLE_NODE and ident.authid in self._nodes:
            self._second_session(session, ident)
            return
        self._welcome(session, ident)

    def _second_session(self, newcomer: HubSession, ident: SessionIdentity) -> None:
        """A node id with a live session: the newcomer is let in only if the holder is dead."""
        node = ident.authid
        holder = self._nodes[node]
        if node in self._checking:
            self._refuse_duplicate(holder, newcomer)
            return
        self._checking.add(node)

        def checked(alive: bool) -> None:
            self._checking.discard(node)
            if self._nodes.get(node) is not holder:
                alive = False  # it left while we asked
            if alive:
                self._refuse_duplicate(holder, newcomer)
                return
            if self._nodes.get(node) is holder:
                log.warn(
                    "{node}'s session from {old} did not answer a ping in {s} s: closed it for the new one from {new}",
                    node=node, old=holder.peer, new=newcomer.peer, s=self.settings.liveness_timeout_s,
                )
                self._left(holder)
                holder.drop()
            if newcomer.open:
                self._welcome(newcomer, ident)

        holder.ping(self._clock, self.settings.liveness_timeout_s).addCallback(checked)

    def _refuse_duplicate(self, holder: HubSession, newcomer: HubSession) -> None:
        node = holder.authid
        earlier = self.duplicates.get(node)
        record = DuplicateSession(node, holder.peer, newcomer.peer, (earlier.count if earlier else 0) + 1,
                                  self._clock.seconds())
        self.duplicates[node] = record
        self.refusals["duplicate_node"] += 1
        log.warn("{sentence}", sentence=record.sentence)
        self._abort(newcomer, uris.ERROR_ALREADY_CONNECTED, record.sentence)
        for listener in self.duplicate_listeners:
            listener(record)

    def _welcome(self, session: HubSession, ident: SessionIdentity) -> None:
        while True:
            session_id = _random.randint(1, MAX_ID)
            if session_id not in self.sessions:
                break
        session._session_id = session_id
        session._authid = ident.authid
        self.sessions[session_id] = session
        if ident.role == uris.ROLE_NODE:
            self._nodes[ident.authid] = session
        session.send(
            message.Welcome(
                session=session_id,
                roles=_ROUTER_ROLES,
                realm=self.realm,
                authid=ident.authid,
                authrole=ident.role,
                authmethod="tls" if ident.role != uris.ROLE_CONTROL else "trusted",
                authprovider="llmgw",
            )
        )
        if self.admitted is not None and session.transport is not None:
            self.admitted(session.transport)
        log.info("session {id} joined: {role} {authid} from {peer}", id=session_id, role=ident.role,
                 authid=ident.authid, peer=session.peer)
        self._meta(META_ON_JOIN, session)

    def _refuse_hello(self, session: HubSession, reason: str, kind: str, text: str) -> None:
        log.warn("aborted a session from {peer}: {text}", peer=session.peer, text=text[:_LOGGED_CHARS])
        self._abort(session, reason, text, kind)

    def _abort(self, session: HubSession, reason: str, text: str, kind: str | None = None) -> None:
        """ABORT *session* with *reason* and *text*; a refusal of *kind* (one of ``metrics.LIMITS``) is counted."""
        if kind is not None:
            self.refusals[kind] += 1
        session.send(message.Abort(reason, text))
        session.drop()

    def _violation(self, session: HubSession, text: str, limit: str | None = None) -> None:
        # ABORT, not GOODBYE, even on an open session: the Basic Profile's
        # "Sessions" gives a second HELLO and other violations ABORT.
        self.refusals[limit or "protocol_violation"] += 1
        log.warn("protocol violation by {s}: {text}", s=session, text=text)
        self._left(session)
        self._abort(session, "wamp.error.protocol_violation", text)

    def _left(self, session: HubSession) -> None:
        self._direct.pop(session, None)
        self._local.pop(session, None)
        if self.sessions.pop(session.session_id, None) is None:
            return
        self.sessions_left += 1
        if self._nodes.get(session.authid) is session:
            del self._nodes[session.authid]
        log.info("session {id} left: {role} {authid} from {peer}", id=session.session_id, role=session.role,
                 authid=session.authid, peer=session.peer)
        for reg in [r for r in self._registrations.values() if r.callee is session]:
            self._drop_registration(reg)
        for sub_id in list(session.subscriptions):
            sub = self._subscriptions_by_id.get(sub_id)
            if sub is not None:
                sub.subscribers.discard(session)
                if not sub.subscribers:
                    self._drop_subscription(sub)
        session.subscriptions.clear()
        for inv in [i for i in self._invocations.values() if session in (i.caller, i.callee)]:
            self._end_invocation(inv)
            if inv.callee is session:
                inv.caller.send(
                    message.Error(message.Call.MESSAGE_TYPE, inv.call_request, "wamp.error.canceled",
                                  args=[f"{session.authid} went away before answering"])
                )
            elif inv.callee.cancellable:
                inv.callee.send(message.Interrupt(inv.id, KILLNOWAIT))
        self._meta(META_ON_LEAVE, session)

    def _meta(self, topic: str, session: HubSession) -> None:
        info = {"session": session.session_id, "authid": session.authid, "authrole": session.role}
        peer = getattr(session._transport, "peer", None)  # autobahn's "tcp4:HOST:PORT"; none in process
        if isinstance(peer, str):
            info["transport"] = {"peer": peer}  # as the WAMP session meta API names it
        if session.not_after is not None:
            info["certificate"] = {"not_after": session.not_after}
        self._publish_event(topic, [info], {}, publisher=None)

    # -- messages of an open session --

    def _dispatch(self, session: HubSession, msg) -> None:
        handler = getattr(self, "_on_" + type(msg).__name__.lower())
        handler(session, msg)

    def _refused(self, session: HubSession, action: str, uri: str, request_type: int, request: int,
                 answer: bool = True) -> bool:
        why = authz.refusal(session.role, session.authid, action, uri)
        if why is None:
            return False
        self.refusals["not_authorized"] += 1
        log.warn("refused {s}: {why}", s=session, why=why[:_LOGGED_CHARS])  # the URI is the peer's, of any length
        if answer:
            session.send(message.Error(request_type, request, uris.ERROR_NOT_AUTHORIZED, args=[why]))
        return True

    def _on_goodbye(self, session: HubSession, msg) -> None:
        session.send(message.Goodbye("wamp.close.goodbye_and_out"))
        session.drop()

    def _on_abort(self, session: HubSession, msg) -> None:
        session.drop()

    def _on_register(self, session: HubSession, msg) -> None:
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

    def _on_unregister(self, session: HubSession, msg) -> None:
        reg = self._registrations_by_id.get(msg.registration)
        if reg is None or reg.callee is not session:
            session.send(message.Error(message.Unregister.MESSAGE_TYPE, msg.request, "wamp.error.no_such_registration",
                                       args=[f"this session holds no registration {msg.registration}"]))
            return
        self._drop_registration(reg)
        session.send(message.Unregistered(msg.request))

    def _drop_registration(self, reg: _Registration) -> None:
        self._registrations.pop(reg.uri, None)
        self._registrations_by_id.pop(reg.id, None)

    def _on_call(self, session: HubSession, msg) -> None:
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
        self._invocations[(callee, inv.id)] = inv
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
        if self._invocations.get((inv.callee, inv.id)) is not inv:
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
        self._invocations.pop((inv.callee, inv.id), None)
        self._calls.pop((inv.caller, inv.call_request), None)
        if inv.timeout is not None and inv.timeout.active():
            inv.timeout.cancel()
        inv.timeout = None

    def _on_cancel(self, session: HubSession, msg) -> None:
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

    def _own_invocation(self, session: HubSession, request: int) -> _Invocation | None:
        return self._invocations.get((session, request))

    def _on_yield(self, session: HubSession, msg) -> None:
        inv = self._own_invocation(session, msg.request)
        if inv is None:
            return  # answered after a timeout or cancel: nobody is waiting
        if not msg.progress:
            self._end_invocation(inv)
        inv.caller.send(message.Result(inv.call_request, args=msg.args, kwargs=msg.kwargs, progress=msg.progress))

    def _on_error(self, session: HubSession, msg) -> None:
        if msg.request_type != message.Invocation.MESSAGE_TYPE:
            return
        inv = self._own_invocation(session, msg.request)
        if inv is None:
            return
        self._end_invocation(inv)
        inv.caller.send(message.Error(message.Call.MESSAGE_TYPE, inv.call_request, msg.error, args=msg.args, kwargs=msg.kwargs))

    def _on_subscribe(self, session: HubSession, msg) -> None:
        if self._refused(session, authz.SUBSCRIBE, msg.topic, message.Subscribe.MESSAGE_TYPE, msg.request):
            return
        match = msg.match or "exact"
        if match not in ("exact", "prefix"):
            session.send(message.Error(message.Subscribe.MESSAGE_TYPE, msg.request, "wamp.error.invalid_argument",
                                       args=["this hub matches topics exactly or by prefix"]))
            return
        table = self._exact if match == "exact" else self._prefix
        sub = table.get(msg.topic)
        if (sub is None or session not in sub.subscribers) and self._too_many_subscriptions(session, msg):
            return
        if sub is None:
            sub = _Subscription(self._new_id(), msg.topic, match)
            table[msg.topic] = sub
            self._subscriptions_by_id[sub.id] = sub
        sub.subscribers.add(session)
        session.subscriptions.add(sub.id)
        session.send(message.Subscribed(msg.request, sub.id))

    def _too_many_subscriptions(self, session: HubSession, msg) -> bool:
        most = self.settings.max_subscriptions_per_session
        if session.role == uris.ROLE_CONTROL or len(session.subscriptions) < most:
            return False
        self.refusals["subscriptions"] += 1
        why = (f"{session.role} {session.authid} holds {most} subscriptions, the most one session may "
               f"(link.max_subscriptions_per_session); subscribe to {uris.EVENT_PREFIX} with match=prefix instead")
        log.warn("refused a subscription to {topic} from {s}: {why}", topic=msg.topic, s=session, why=why)
        session.send(message.Error(message.Subscribe.MESSAGE_TYPE, msg.request, uris.ERROR_LIMIT, args=[why]))
        return True

    def _on_unsubscribe(self, session: HubSession, msg) -> None:
        sub = self._subscriptions_by_id.get(msg.subscription)
        if sub is None or session not in sub.subscribers:
            session.send(message.Error(message.Unsubscribe.MESSAGE_TYPE, msg.request, "wamp.error.no_such_subscription",
                                       args=[f"this session holds no subscription {msg.subscription}"]))
            return
        sub.subscribers.discard(session)
        session.subscriptions.discard(sub.id)
        if not sub.subscribers:
            self._drop_subscription(sub)
        session.send(message.Unsubscribed(msg.request))

    def _drop_subscription(self, sub: _Subscription) -> None:
        table = self._exact if sub.match == "exact" else self._prefix
        if table.get(sub.topic) is sub:
            del table[sub.topic]
        self._subscriptions_by_id.pop(sub.id, None)

    def _on_publish(self, session: HubSession, msg) -> None:
        # Basic Profile, "Publishing and Events": an unacknowledged publication
        # hears nothing back, refused or not.
        if self._refused(session, authz.PUBLISH, msg.topic, message.Publish.MESSAGE_TYPE, msg.request,
                         answer=bool(msg.acknowledge)):
            return
        publication = self._publish_event(msg.topic, msg.args, msg.kwargs, publisher=None if msg.exclude_me is False else session)
        if msg.acknowledge:
            session.send(message.Published(msg.request, publication))

    def _publish_event(self, topic: str, args, kwargs, publisher: HubSession | None) -> int:
        publication = _publications.randint(1, MAX_ID)
        matching = [self._exact[topic]] if topic in self._exact else []
        matching += [sub for prefix, sub in list(self._prefix.items()) if topic.startswith(prefix)]
        for sub in matching:
            for subscriber in list(sub.subscribers):
                if subscriber is not publisher:
                    subscriber.send(message.Event(sub.id, publication, args=args, kwargs=kwargs, topic=topic))
        return publication
