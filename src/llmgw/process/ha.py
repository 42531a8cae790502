"""A server among several (server.yaml's ``ha:``): the leader commands the fleet, a standby serves the API and waits.

``Roles`` holds this server's part: the etcd client, the election
(``llmgw.ha.election``) and the servers' list (``llmgw.ha.servers``).  It
hooks the control session (``attach``) so that

- every command to a node carries the epoch while ``Election.can_command``
  is true, and raises ``NotLeading`` naming the leader otherwise (nothing is
  sent);
- the reconciler ticks, and the endpoint table is published, only while this
  server may command — and after taking the lead, only once the fleet has
  settled again, so the agents' registrations are heard and adopted before
  anything is placed or any router is told a table built from a fleet still
  arriving.  The leader keeps its nodes' ids in etcd (``llmgw.ha.members``);
  a new leader waits for exactly those (or ``fleet.settle_max_s``), and
  without such a list as after a restart (``fleet.settle_s``);
- a standby refuses an agent's registration with ``llmgw.error.standby``,
  naming the leader's hub URL (``leader_url``), and an operator's action
  (drain, cordon, uncordon, reload, scale, weights --collect, signing and
  revoking) with the leader's name and URL; reads answer;
- ``llmgw.cp.status`` lists every server, its role and epoch.

The leader puts its endpoint table at ``/llmgw/endpoints`` whenever it
publishes one; a standby follows that key (a watch, and one read at start)
into its own router and to the router workers on its hub, so its API serves
what the leader's would.  On stepping down a server stops commanding at once
(its deadline has passed), closes its agents' sessions so they go to the
leader, and keeps serving the API.
"""

from __future__ import annotations

import json
from typing import Callable

from autobahn.wamp.exception import ApplicationError
from twisted.application import service
from twisted.internet import defer
from twisted.logger import Logger

from llmgw.config.ha import HASettings
from llmgw.control.settle import Settle
from llmgw.ha import members
from llmgw.ha.election import Election
from llmgw.ha.etcd import EtcdClient, EtcdError
from llmgw.ha.fence import NotLeading
from llmgw.ha.members import Members
from llmgw.ha.servers import Servers
from llmgw.ha.watch import WatchKind
from llmgw.link import uris
from llmgw.roles import ROLE_NODE
from llmgw.states import NodeState
from llmgw.text import printable
from llmgw.views import EndpointTable, EventKind, ServerRole, ServerView
from llmgw.wire import WireError, from_wire, to_wire

log = Logger()

ENDPOINTS_KEY = b"/llmgw/endpoints"
#: What a standby refuses: each changes the fleet or the CA, so only the leader does it.
ACTIONS = frozenset({uris.CP_DRAIN, uris.CP_CORDON, uris.CP_UNCORDON, uris.CP_RELOAD, uris.CP_SCALE,
                     uris.CP_SIGN_NODE, uris.CP_REVOKE_NODE})


class Roles(service.Service):
    """This server's election, its entry in the servers' list, and the hooks that make a standby one."""

    def __init__(self, reactor, settings: HASettings, hub, router=None, client=None):
        self.clock = reactor
        self.settings = settings
        self.name = settings.server_name()
        self.hub, self.router = hub, router
        self.client = client if client is not None else EtcdClient(
            reactor, settings.etcd, settings.tls, settings.request_timeout_s, settings.max_response_bytes)
        self.election = Election(reactor, self.client, self.name, settings.advertise, settings.lease_s,
                                 settings.fence_margin_s)
        self.servers = Servers(reactor, self.client, self.name, settings.lease_s)
        self.members = Members(reactor, self.client, self._member_ids, settings.max_response_bytes)
        self.session = None
        self.role = ServerRole.CAMPAIGNING
        self.since = reactor.seconds()
        self.followed: EndpointTable | None = None  # the leader's table, as a standby last read it
        self._settle: Settle | None = None  # the wait after taking the lead
        self._put_pending: bytes | None = None
        self._putting = False
        self._watches: list = []

    # -- the control session's hooks --

    def attach(self, session) -> None:
        """Hook *session* (before it joins the hub): its commands' epoch, its ticks, its procedures."""
        self.session = session
        session.command_epoch = self.command_epoch
        session.guard = self.guard
        session.reconciler.tick = self._only_commanding(session.reconciler.tick)
        session.publish_endpoints = self._publishing(session.publish_endpoints)
        session.table_listeners.append(self._put_table)
        session.event_listeners.append(self._fleet_event)

    def may_command(self) -> bool:
        return self.election.can_command(self.clock.seconds())

    def command_epoch(self) -> int:
        if self.may_command():
            assert self.election.epoch is not None
            return self.election.epoch
        raise NotLeading(f"{self.name} no longer leads: {self._elsewhere()}; run the command there")

    def _only_commanding(self, act: Callable[[], object]) -> Callable[[], None]:
        def gated() -> None:
            if self.may_command():
                act()
        return gated

    def _publishing(self, publish: Callable[..., None]) -> Callable[..., None]:
        """*publish* (the session's ``publish_endpoints``) while commanding and settled; the first one whatever."""
        def gated(force: bool = False) -> None:
            if not self.may_command():
                return
            if self._settle is not None:
                if self._settle.waiting(self.clock.seconds()) is not None:
                    return  # the router keeps the table the last leader put until the fleet is heard again
                self._settle, force = None, True  # the first table once settled goes out, whatever it was before
                log.info("{name}: the fleet has settled; placing, and publishing the endpoint table", name=self.name)
                self.members.forget_written()
                self.members.changed()
            publish(force)
        return gated

    def _elsewhere(self) -> str:
        leader = self.election.leader
        if leader is None or leader.name == self.name:
            return ("no server leads now (an election is under way, or etcd does not answer: check ha.etcd "
                    f"{', '.join(self.settings.etcd)})")
        return f"{leader.name} at {leader.url} does (epoch {leader.epoch})"

    def refusal(self, what: str) -> ApplicationError:
        """``llmgw.error.standby`` for *what* this server will not do while it does not command, naming the leader."""
        leader = self.election.leader
        if self.election.leading:
            words = (f"{what}: {self.name} cannot be sure it still leads (etcd has not renewed its lease in time); "
                     "try again in a few seconds")
            return ApplicationError(uris.ERROR_STANDBY, words)
        if leader is None or leader.name == self.name:
            return ApplicationError(uris.ERROR_STANDBY, f"{what}: standby; {self._elsewhere()}; try again in a few "
                                    "seconds")
        return ApplicationError(uris.ERROR_STANDBY, f"{what}: standby; the leader is {leader.name} at {leader.url} "
                                f"(epoch {leader.epoch}); ask it there (llmgw ctl --hub {leader.url})",
                                leader_url=leader.url)

    def guard(self, uri: str, endpoint: Callable) -> Callable:
        """*endpoint* as the session registers *uri*: refused on a standby when it changes things, or decorated."""
        if uri == uris.AGENT_REGISTER or uri in ACTIONS:
            verb = "registration refused" if uri == uris.AGENT_REGISTER else f"{uri} refused"

            def leading_only(*args, **kwargs):
                if not self.may_command():
                    raise self.refusal(verb)
                return endpoint(*args, **kwargs)
            return leading_only
        if uri == uris.CP_WEIGHTS:
            def no_collecting(collect=False):
                if collect and not self.may_command():
                    raise self.refusal(f"{uri} --collect refused")
                return endpoint(collect)
            return no_collecting
        if uri == uris.CP_STATUS:
            def with_servers():
                answer = endpoint()
                answer["servers"] = to_wire(self.server_views())
                return answer
            return with_servers
        if uri == uris.ROUTER_ENDPOINTS:
            def table():
                if not self.may_command() and self.followed is not None:
                    return to_wire(self.followed)
                return endpoint()
            return table
        return endpoint

    def server_views(self) -> list[ServerView]:
        """Every server etcd lists, this one as it is now (its entry may be a renewal behind)."""
        others = [v for v in self.servers.known if v.name != self.name]
        return sorted([*others, self.view()], key=lambda v: v.name)

    def view(self) -> ServerView:
        return ServerView(self.name, self.role, self.settings.advertise, self.settings.api_advertise,
                          self.election.epoch if self.election.leading else None, self.since)

    # -- the election's changes --

    def changed(self, election: Election) -> None:
        role = (ServerRole.LEADER if election.leading else
                ServerRole.STANDBY if election.leader is not None else ServerRole.CAMPAIGNING)
        was, self.role = self.role, role
        if role is not was:
            self.since = self.clock.seconds()
        if was is ServerRole.LEADER and role is not ServerRole.LEADER:
            self._step_down()
        if role is ServerRole.LEADER and was is not ServerRole.LEADER:
            self._take_lead()
        self.servers.announce(role, self.settings.advertise, self.settings.api_advertise, self.view().epoch,
                              self.since).addErrback(lambda f: None)

    def _take_lead(self) -> None:
        session = self.session
        now = self.clock.seconds()
        if session is not None:
            # The agents come back with what they run, and nothing is placed until they have: the nodes
            # the last leader listed, as this server last read them (and read again now), or as after a restart.
            self._settle = session.reconciler.restart_settle(now, self.members.known or ())
            defer.Deferred.fromCoroutine(self._expect_fresh(self._settle))
        expected = len(self._settle.expected) if self._settle is not None else 0
        log.info("{name} leads the fleet, epoch {epoch}: placing waits for {whom} to register here",
                 name=self.name, epoch=self.election.epoch,
                 whom=f"the {expected} node(s) the last leader listed" if expected else "the agents")

    async def _expect_fresh(self, settle: Settle) -> None:
        """The list etcd holds now, in case this server's copy was behind: its nodes are waited for too."""
        fresh = await self.members.read()
        if not fresh or fresh <= settle.expected or settle is not self._settle or self.session is None:
            return
        if settle.waiting(self.clock.seconds()) is None:
            return  # settled already (and for good)
        self._settle = self.session.reconciler.restart_settle(settle.started, settle.expected | fresh)

    def _member_ids(self) -> list[str] | None:
        """The ids of this leader's nodes that are not lost; None while it may not say (standby, or settling)."""
        if self.session is None or self._settle is not None or not self.may_command():
            return None
        return [n.id for n in self.session.fleet.nodes.values() if n.state is not NodeState.LOST]

    def _fleet_event(self, kind, ident, event) -> None:
        if kind is EventKind.NODE:
            self.members.changed()

    def _step_down(self) -> None:
        nodes = [s for s in list(self.hub.sessions.values()) if s.role == ROLE_NODE]
        log.warn("{name} no longer leads ({where}): commands stop now; closing {n} agent session(s) so they go to "
                 "the leader; the API keeps serving", name=self.name, where=self._elsewhere(), n=len(nodes))
        for node in nodes:
            node.drop()

    # -- the endpoint table through etcd --

    def _put_table(self, table: EndpointTable) -> None:
        """The leader's table, put at ``/llmgw/endpoints`` (the latest only, one put at a time)."""
        if not self.may_command():
            return
        data = json.dumps(to_wire(table), separators=(",", ":")).encode()
        if len(data) > self.settings.max_response_bytes:
            log.warn("the endpoint table is {n} bytes, more than ha.max_response_bytes ({most}): not put in etcd, so "
                     "a standby's API keeps the last one; raise ha.max_response_bytes", n=len(data),
                     most=self.settings.max_response_bytes)
            return
        self._put_pending = data
        if not self._putting:
            defer.Deferred.fromCoroutine(self._put_latest())

    async def _put_latest(self) -> None:
        self._putting = True
        try:
            while self._put_pending is not None:
                data, self._put_pending = self._put_pending, None
                try:
                    await self.client.put(ENDPOINTS_KEY, data)
                except EtcdError as e:
                    log.warn("could not put the endpoint table in etcd ({why}); a standby's API serves the last one "
                             "until the next change", why=str(e))
        finally:
            self._putting = False

    def _follow(self, events) -> None:
        for event in events:
            if event.kind is WatchKind.PUT:
                self._read_table(event.kv.value)

    def _follow_members(self, events) -> None:
        for event in events:
            if event.kind is WatchKind.PUT:
                self.members.heard(event.kv.value)

    def _read_table(self, data: bytes) -> None:
        if self.may_command():
            return  # this server's own table, come back
        if len(data) > self.settings.max_response_bytes:
            return
        try:
            table = from_wire(EndpointTable, json.loads(data))
        except (ValueError, WireError) as e:
            log.warn("the endpoint table in etcd is not one llmgw reads ({why}): the API keeps the last one",
                     why=printable(str(e))[:300])
            return
        self.followed = table
        if self.router is not None:
            self.router.apply_table(table)
        session = self.session
        if session is not None and session.is_attached():
            session.publish(uris.EVENT_ENDPOINTS, to_wire(table))

    async def _read_once(self) -> None:
        try:
            kv = await self.client.get(ENDPOINTS_KEY)
        except EtcdError as e:
            log.info("could not read the leader's endpoint table yet ({why}); the watch brings it", why=str(e))
            return
        if kv is not None and self.followed is None:
            self._read_table(kv.value)

    # -- the service --

    def startService(self) -> None:
        super().startService()
        log.info("{name}: ha: with etcd at {etcd}; campaigning for the lead (lease {lease} s)", name=self.name,
                 etcd=", ".join(self.settings.etcd), lease=self.settings.lease_s)
        self.election.listeners.append(self.changed)
        self.servers.announce(self.role, self.settings.advertise, self.settings.api_advertise, None,
                              self.since).addErrback(lambda f: None)
        self.servers.start()
        self._watches = [self.client.watch(ENDPOINTS_KEY, self._follow),
                         self.client.watch(members.KEY, self._follow_members)]
        defer.Deferred.fromCoroutine(self._read_once())
        defer.Deferred.fromCoroutine(self.members.read())
        self.election.start()

    def stopService(self):
        super().stopService()
        for watch in self._watches:
            watch.stop()
        self.members.stop()
        return defer.DeferredList([self.election.stop(), self.servers.stop()]).addBoth(
            lambda _: self.client.close())
