"""The hub: a small WAMP router embedded in the server, and who it lets in.

The Basic Profile — HELLO/WELCOME/ABORT/GOODBYE, REGISTER/CALL/INVOCATION/
YIELD/ERROR, SUBSCRIBE/PUBLISH/EVENT — with the Advanced Profile features
llmgw's parts use.  A router we can read end to end is one we can trust
with the fleet.  This module holds its sessions: their opening, HELLO and
WELCOME, their refusals and their leaving.  Calls are routed by the dealer
(``llmgw.link.dealer``), events by the broker (``llmgw.link.broker``);
frames are parsed in ``llmgw.link.inbound``; one peer is a ``HubSession``
(``llmgw.link.peer``); its ids are ``llmgw.link.ids``.

Identity is never taken from a client: a remote session's authid and role
come from its TLS client certificate (``identity_of``), and a HELLO that
claims another authid is aborted.  A node identity has one live session:
a second is admitted only if the first does not answer a ping (it is then
closed), and otherwise refused in a sentence naming both peers.  The
control plane itself attaches in process through ``attach_local``.

Every limit in ``LinkSettings`` that refuses or ends something counts it
in ``Hub.refusals`` (by limit) and logs one line naming the peer.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from typing import Callable

import attrs
from autobahn.twisted.websocket import WampWebSocketServerFactory
from autobahn.wamp import message, role
from twisted.logger import Logger

from llmgw.verbose import verbose_logs
from llmgw.errors import PKIError
from llmgw.link import answers, authz, ids, inbound, uris
from llmgw.link.broker import Broker
from llmgw.link.dealer import Dealer
from llmgw.link.local import LocalLink
from llmgw.link.peer import HubProtocol, HubSession, SessionIdentity
from llmgw.link.session import LinkJsonSerializer, quiet_cancellations, sweep_pings
from llmgw.link.settings import LinkSettings
from llmgw.link.tls import SessionRefusal, refused_session
from llmgw.roles import ROLE_CONTROL, ROLE_NODE

log = Logger()

META_ON_JOIN = "wamp.session.on_join"
META_ON_LEAVE = "wamp.session.on_leave"

_ROUTER_ROLES = {
    "broker": role.RoleBrokerFeatures(pattern_based_subscription=True, publisher_exclusion=True),
    "dealer": role.RoleDealerFeatures(
        caller_identification=True, call_canceling=True, call_timeout=True, progressive_call_results=True
    ),
}

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


class Hub:
    """One realm's sessions, and the dealer and broker that serve them.

    *session_ids* and *publication_ids* are the generators its global-scope
    ids are drawn from (``llmgw.link.ids``); a test gives seeded ones.
    """

    def __init__(self, clock, realm: str = uris.REALM, identify: Callable | None = None,
                 settings: LinkSettings | None = None, session_ids: random.Random | None = None,
                 publication_ids: random.Random | None = None):
        self.realm = realm
        self._clock = clock
        self._identify = identify
        self.settings = settings or LinkSettings()
        self._session_ids = session_ids if session_ids is not None else ids.session_ids()
        self.sessions: dict[int, HubSession] = {}
        self.sessions_left = 0  # sessions that have left since the hub started
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
        router_ids = itertools.count(1).__next__  # registrations and subscriptions, one count
        self.dealer = Dealer(clock, self._refused, router_ids)
        self.broker = Broker(self.settings, self.refusals, self._refused, router_ids,
                             publication_ids if publication_ids is not None else ids.publication_ids())
        dealer, broker = self.dealer, self.broker
        self._handlers: dict[type, Callable[[HubSession, object], None]] = {
            message.Goodbye: self._on_goodbye,
            message.Abort: self._on_abort,
            message.Register: dealer.on_register,
            message.Unregister: dealer.on_unregister,
            message.Call: dealer.on_call,
            message.Cancel: dealer.on_cancel,
            message.Yield: dealer.on_yield,
            message.Error: dealer.on_error,
            message.Subscribe: broker.on_subscribe,
            message.Unsubscribe: broker.on_unsubscribe,
            message.Publish: broker.on_publish,
        }

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

    def attach_local(self, app_session, authid: str = "control", role: str = ROLE_CONTROL) -> None:
        """Attach an in-process autobahn session: the control plane, with full rights.

        Tests attach other roles the same way; they are held to the same rules
        as over the network, since authorization looks only at the role.
        """
        hub_side = HubSession(self, SessionIdentity(authid, role))
        self.dealer.attach_local(hub_side, app_session)
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
        self.dealer.answer_refused(session, refused)
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
        if ident.role != ROLE_CONTROL and (refused := authz.session_refusal(ident.role, ident.authid)):
            self._refuse_hello(session, uris.ERROR_NOT_AUTHORIZED, "certificate_subject", refused)
            return
        callee = (msg.roles or {}).get("callee")
        session.cancellable = bool(getattr(callee, "call_canceling", False))
        if ident.role == ROLE_NODE and ident.authid in self._nodes:
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
            session_id = ids.global_id(self._session_ids)
            if session_id not in self.sessions:
                break
        session._session_id = session_id
        session._authid = ident.authid
        self.sessions[session_id] = session
        if ident.role == ROLE_NODE:
            self._nodes[ident.authid] = session
        session.send(
            message.Welcome(
                session=session_id,
                roles=_ROUTER_ROLES,
                realm=self.realm,
                authid=ident.authid,
                authrole=ident.role,
                authmethod="tls" if ident.role != ROLE_CONTROL else "trusted",
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
        self.dealer.detach(session)
        if self.sessions.pop(session.session_id, None) is None:
            return
        self.sessions_left += 1
        if self._nodes.get(session.authid) is session:
            del self._nodes[session.authid]
        log.info("session {id} left: {role} {authid} from {peer}", id=session.session_id, role=session.role,
                 authid=session.authid, peer=session.peer)
        self.broker.session_left(session)
        self.dealer.session_left(session)
        self._meta(META_ON_LEAVE, session)

    def _meta(self, topic: str, session: HubSession) -> None:
        info = {"session": session.session_id, "authid": session.authid, "authrole": session.role}
        peer = getattr(session._transport, "peer", None)  # autobahn's "tcp4:HOST:PORT"; none in process
        if isinstance(peer, str):
            info["transport"] = {"peer": peer}  # as the WAMP session meta API names it
        if session.not_after is not None:
            info["certificate"] = {"not_after": session.not_after}
        self.broker.publish_event(topic, [info], {}, publisher=None)

    # -- messages of an open session --

    def _dispatch(self, session: HubSession, msg) -> None:
        self._handlers[type(msg)](session, msg)

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
