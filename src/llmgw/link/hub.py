"""The hub: a small WAMP router embedded in the server.

Basic profile only — HELLO/WELCOME/ABORT/GOODBYE, REGISTER/CALL/INVOCATION/
YIELD/ERROR with call timeouts and cancel, SUBSCRIBE/PUBLISH/EVENT with exact
and prefix matching — because that is all llmgw's parts use, and a router we
can read end to end is one we can trust with the fleet.

Identity is never taken from a client: a remote session's authid and role
come from its TLS client certificate (``identity_of``), and a HELLO that
claims another authid is aborted.  The caller is always disclosed to the
callee, so the control plane reads who is asking from the call details.
The control plane itself attaches in process through ``attach_local``.
"""

from __future__ import annotations

import itertools
from collections import deque
from typing import Callable

import attrs
import txaio
from autobahn.twisted.websocket import WampWebSocketServerFactory, WampWebSocketServerProtocol
from autobahn.exception import Disconnected
from autobahn.wamp import message, role
from autobahn.wamp.exception import TransportLost
from autobahn.wamp.serializer import JsonSerializer
from autobahn.wamp.types import TransportDetails
from twisted.logger import Logger

from llmgw.config.common import verbose_logs
from llmgw.errors import PKIError
from llmgw.link import authz, uris

log = Logger()

_ids = itertools.count(1)

META_ON_JOIN = "wamp.session.on_join"
META_ON_LEAVE = "wamp.session.on_leave"

# What a client may send once its session is open.  Anything else (a WELCOME,
# an EVENT, a second HELLO) is a protocol violation and ends the session.
_CLIENT_MESSAGES = (
    message.Goodbye,
    message.Abort,
    message.Register,
    message.Unregister,
    message.Call,
    message.Cancel,
    message.Yield,
    message.Error,
    message.Subscribe,
    message.Unsubscribe,
    message.Publish,
)

_ROUTER_ROLES = {
    "broker": role.RoleBrokerFeatures(pattern_based_subscription=True, publisher_exclusion=True),
    "dealer": role.RoleDealerFeatures(
        caller_identification=True, call_canceling=True, call_timeout=True, progressive_call_results=True
    ),
}


@attrs.frozen
class SessionIdentity:
    """Who a hub session is: its WAMP authid and authrole, from its certificate or ``attach_local``."""

    authid: str
    role: str


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
    timeout: object | None = None


class HubSession:
    """One client's session, remote (over WebSocket) or local (the control plane)."""

    def __init__(self, hub: Hub, identity: SessionIdentity | None = None):
        self._hub = hub
        self._identity = identity
        self._transport = None
        self._session_id: int | None = None
        self._authid: str | None = None

    # -- the ISession side autobahn's WebSocket protocol drives --

    def onOpen(self, transport) -> None:
        self._transport = transport
        if self._identity is None:
            self._identity = self._hub._identity_from(transport)

    def onMessage(self, msg) -> None:
        if self._session_id is None:
            self._hub._hello(self, msg)
        elif isinstance(msg, _CLIENT_MESSAGES):
            self._hub._dispatch(self, msg)
        else:
            self._hub._violation(self, f"a client may not send {type(msg).__name__}")

    def onClose(self, wasClean: bool) -> None:
        self._hub._left(self)
        self._transport = None

    # -- used by the hub --

    @property
    def authid(self) -> str | None:
        return self._authid

    @property
    def role(self) -> str | None:
        return self._identity.role if self._identity else None

    @property
    def session_id(self) -> int | None:
        return self._session_id

    def send(self, msg) -> None:
        if self._transport is not None and self._transport.isOpen():
            try:
                self._transport.send(msg)
            except (Disconnected, TransportLost):
                pass  # the peer is gone; its onClose cleans up

    def drop(self) -> None:
        if self._transport is not None and self._transport.isOpen():
            self._transport.close()

    def __repr__(self) -> str:
        return f"<session {self._session_id} {self.role}:{self._authid}>"


class Hub:
    def __init__(self, clock, realm: str = uris.REALM, identify: Callable | None = None):
        self.realm = realm
        self._clock = clock
        self._identify = identify
        self.sessions: dict[int, HubSession] = {}
        self._registrations: dict[str, _Registration] = {}
        self._registrations_by_id: dict[int, _Registration] = {}
        self._subscriptions: dict[tuple[str, str], _Subscription] = {}
        self._subscriptions_by_id: dict[int, _Subscription] = {}
        self._invocations: dict[int, _Invocation] = {}

    # -- attaching sessions --

    def websocket_factory(self, url: str | None = None) -> WampWebSocketServerFactory:
        factory = WampWebSocketServerFactory(
            lambda: HubSession(self), url=url, serializers=[JsonSerializer()]
        )
        factory.protocol = WampWebSocketServerProtocol
        factory.noisy = verbose_logs()
        # A half-open connection (a node that lost power) is found by pings,
        # not by waiting for TCP to notice.
        factory.setProtocolOptions(
            maxMessagePayloadSize=16 * 1024 * 1024,
            maxFramePayloadSize=16 * 1024 * 1024,
            autoPingInterval=10,
            autoPingTimeout=20,
        )
        return factory

    def attach_local(self, app_session, authid: str = "control", role: str = uris.ROLE_CONTROL) -> None:
        """Attach an in-process autobahn session: the control plane, with full rights.

        Tests attach other roles the same way; they are held to the same rules
        as over the network, since authorization looks only at the role.
        """
        hub_side = HubSession(self, SessionIdentity(authid, role))
        _LocalLink(self._clock, hub_side, app_session).open()

    def _identity_from(self, transport) -> SessionIdentity | None:
        tls = getattr(transport, "transport", None)
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
            log.warn("refusing a client certificate: {why}", why=str(e))
            return None
        return SessionIdentity(ident.name, ident.role)

    # -- opening and closing --

    def _hello(self, session: HubSession, msg) -> None:
        if not isinstance(msg, message.Hello):
            self._violation(session, f"expected HELLO, got {type(msg).__name__}")
            return
        ident = session._identity
        if ident is None:
            self._abort(session, uris.ERROR_NOT_AUTHORIZED, "no valid client certificate from the cluster CA")
            return
        if msg.realm != self.realm:
            self._abort(session, "wamp.error.no_such_realm", f"no realm {msg.realm!r}; the realm is {self.realm!r}")
            return
        if msg.authid is not None and msg.authid != ident.authid:
            log.warn(
                "aborted a session: certificate {cn} ({role}) claimed authid {claimed}",
                cn=ident.authid, role=ident.role, claimed=msg.authid,
            )
            self._abort(
                session, uris.ERROR_NOT_AUTHORIZED,
                f"the client certificate is for {ident.authid!r}, the HELLO claims {msg.authid!r}",
            )
            return
        if ident.role != uris.ROLE_CONTROL:
            refused = authz.session_refusal(ident.role, ident.authid)
            if refused:
                self._abort(session, uris.ERROR_NOT_AUTHORIZED, refused)
                return
        session._session_id = next(_ids)
        session._authid = ident.authid
        self.sessions[session._session_id] = session
        session.send(
            message.Welcome(
                session=session._session_id,
                roles=_ROUTER_ROLES,
                realm=self.realm,
                authid=ident.authid,
                authrole=ident.role,
                authmethod="tls" if ident.role != uris.ROLE_CONTROL else "trusted",
                authprovider="llmgw",
            )
        )
        log.info("session {id} joined: {role} {authid}", id=session._session_id, role=ident.role, authid=ident.authid)
        self._meta(META_ON_JOIN, session)

    def _abort(self, session: HubSession, reason: str, text: str) -> None:
        session.send(message.Abort(reason, text))
        session.drop()

    def _violation(self, session: HubSession, text: str) -> None:
        log.warn("protocol violation by {s}: {text}", s=session, text=text)
        if session.session_id is None:
            self._abort(session, "wamp.error.protocol_violation", text)
        else:
            # ABORT belongs to the opening handshake; an open session is ended with GOODBYE.
            session.send(message.Goodbye("wamp.error.protocol_violation", text))
            session.drop()

    def _left(self, session: HubSession) -> None:
        if self.sessions.pop(session.session_id, None) is None:
            return
        log.info("session {id} left: {role} {authid}", id=session.session_id, role=session.role, authid=session.authid)
        for reg in [r for r in self._registrations.values() if r.callee is session]:
            self._drop_registration(reg)
        for sub in list(self._subscriptions.values()):
            sub.subscribers.discard(session)
            if not sub.subscribers:
                self._drop_subscription(sub)
        for inv in [i for i in self._invocations.values() if session in (i.caller, i.callee)]:
            self._end_invocation(inv)
            if inv.callee is session:
                inv.caller.send(
                    message.Error(message.Call.MESSAGE_TYPE, inv.call_request, "wamp.error.canceled",
                                  args=[f"{session.authid} went away before answering"])
                )
            else:
                inv.callee.send(message.Interrupt(inv.id, message.Cancel.KILLNOWAIT))
        self._meta(META_ON_LEAVE, session)

    def _meta(self, topic: str, session: HubSession) -> None:
        info = {"session": session.session_id, "authid": session.authid, "authrole": session.role}
        peer = getattr(session._transport, "peer", None)  # autobahn's "tcp4:HOST:PORT"; none in process
        if isinstance(peer, str):
            info["transport"] = {"peer": peer}  # as the WAMP session meta API names it
        self._publish_event(topic, [info], {}, publisher=None)

    # -- messages of an open session --

    def _dispatch(self, session: HubSession, msg) -> None:
        handler = getattr(self, "_on_" + type(msg).__name__.lower())
        handler(session, msg)

    def _refused(self, session: HubSession, action: str, uri: str, request_type: int, request: int) -> bool:
        why = authz.refusal(session.role, session.authid, action, uri)
        if why is None:
            return False
        log.warn("refused {s}: {why}", s=session, why=why)
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
        reg = _Registration(next(_ids), msg.procedure, session)
        self._registrations[reg.uri] = reg
        self._registrations_by_id[reg.id] = reg
        session.send(message.Registered(msg.request, reg.id))

    def _on_unregister(self, session: HubSession, msg) -> None:
        reg = self._registrations_by_id.get(msg.registration)
        if reg is None or reg.callee is not session:
            session.send(message.Error(message.Unregister.MESSAGE_TYPE, msg.request, "wamp.error.no_such_registration"))
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
        inv = _Invocation(next(_ids), session, msg.request, reg.callee)
        self._invocations[inv.id] = inv
        if msg.timeout:
            inv.timeout = self._clock.callLater(msg.timeout / 1000.0, self._timed_out, inv)
        reg.callee.send(
            message.Invocation(
                inv.id, reg.id, args=msg.args, kwargs=msg.kwargs, timeout=msg.timeout,
                receive_progress=msg.receive_progress,
                caller=session.session_id, caller_authid=session.authid, caller_authrole=session.role,
                procedure=msg.procedure,
            )
        )

    def _timed_out(self, inv: _Invocation) -> None:
        inv.timeout = None
        if self._invocations.pop(inv.id, None) is None:
            return
        inv.callee.send(message.Interrupt(inv.id, message.Cancel.KILLNOWAIT, reason="wamp.error.timeout"))
        inv.caller.send(message.Error(message.Call.MESSAGE_TYPE, inv.call_request, "wamp.error.timeout",
                                      args=[f"{inv.callee.authid} did not answer in time"]))

    def _end_invocation(self, inv: _Invocation) -> None:
        self._invocations.pop(inv.id, None)
        if inv.timeout is not None and inv.timeout.active():
            inv.timeout.cancel()
        inv.timeout = None

    def _on_cancel(self, session: HubSession, msg) -> None:
        for inv in list(self._invocations.values()):
            if inv.caller is session and inv.call_request == msg.request:
                self._end_invocation(inv)
                inv.callee.send(message.Interrupt(inv.id, msg.mode or message.Cancel.KILLNOWAIT))
                session.send(message.Error(message.Call.MESSAGE_TYPE, msg.request, "wamp.error.canceled"))
                return

    def _own_invocation(self, session: HubSession, request: int) -> _Invocation | None:
        inv = self._invocations.get(request)
        return inv if inv is not None and inv.callee is session else None

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
        sub = self._subscriptions.get((match, msg.topic))
        if sub is None:
            sub = _Subscription(next(_ids), msg.topic, match)
            self._subscriptions[(match, msg.topic)] = sub
            self._subscriptions_by_id[sub.id] = sub
        sub.subscribers.add(session)
        session.send(message.Subscribed(msg.request, sub.id))

    def _on_unsubscribe(self, session: HubSession, msg) -> None:
        sub = self._subscriptions_by_id.get(msg.subscription)
        if sub is None or session not in sub.subscribers:
            session.send(message.Error(message.Unsubscribe.MESSAGE_TYPE, msg.request, "wamp.error.no_such_subscription"))
            return
        sub.subscribers.discard(session)
        if not sub.subscribers:
            self._drop_subscription(sub)
        session.send(message.Unsubscribed(msg.request))

    def _drop_subscription(self, sub: _Subscription) -> None:
        self._subscriptions.pop((sub.match, sub.topic), None)
        self._subscriptions_by_id.pop(sub.id, None)

    def _on_publish(self, session: HubSession, msg) -> None:
        if self._refused(session, authz.PUBLISH, msg.topic, message.Publish.MESSAGE_TYPE, msg.request):
            return
        publication = self._publish_event(msg.topic, msg.args, msg.kwargs, publisher=None if msg.exclude_me is False else session)
        if msg.acknowledge:
            session.send(message.Published(msg.request, publication))

    def _publish_event(self, topic: str, args, kwargs, publisher: HubSession | None) -> int:
        publication = next(_ids)
        for sub in list(self._subscriptions.values()):
            if sub.topic == topic or (sub.match == "prefix" and topic.startswith(sub.topic)):
                for subscriber in list(sub.subscribers):
                    if subscriber is not publisher:
                        subscriber.send(message.Event(sub.id, publication, args=args, kwargs=kwargs, topic=topic))
        return publication


class _LocalLink:
    """An in-process transport pair between the hub and an autobahn session.

    Messages are delivered in order, each on a later reactor turn, so neither
    side re-enters the other from inside its own message handling.
    """

    def __init__(self, clock, hub_side: HubSession, app_session):
        self._clock = clock
        self._queue: deque = deque()
        self._scheduled = False
        self._open = True
        self.hub_side = hub_side
        self.app_session = app_session
        self._to_hub = _LocalEnd(self, lambda m: hub_side.onMessage(m))
        self._to_app = _LocalEnd(self, lambda m: app_session.onMessage(m))

    def open(self) -> None:
        self.hub_side.onOpen(self._to_app)
        self.app_session.onOpen(self._to_hub)

    def post(self, deliver, msg) -> None:
        self._queue.append((deliver, msg))
        if not self._scheduled:
            self._scheduled = True
            self._clock.callLater(0, self._drain)

    def _drain(self) -> None:
        self._scheduled = False
        while self._queue and self._open:
            deliver, msg = self._queue.popleft()
            try:
                deliver(msg)
            except Exception:
                log.failure("in-process link: delivering {msg}", msg=type(msg).__name__)

    def close(self) -> None:
        if not self._open:
            return
        self._open = False
        self.hub_side.onClose(True)
        self.app_session.onClose(True)
        txaio.resolve(self._to_hub.is_closed, None)


class _LocalEnd:
    _serializer = JsonSerializer()

    def __init__(self, link: _LocalLink, deliver):
        self._link = link
        self._deliver = deliver
        self.is_closed = txaio.create_future()
        self.transport_details = TransportDetails(channel_type=TransportDetails.CHANNEL_TYPE_FUNCTION)

    def send(self, msg) -> None:
        self._link.post(self._deliver, msg)

    def isOpen(self) -> bool:
        return self._link._open

    def close(self) -> None:
        self._link.close()

    abort = close
