"""The control plane's session on the hub: agents' reports in, operators' queries out.

Who is calling comes from the call details the hub fills in from the
caller's certificate — never from the payload.  A payload that does not fit
its record is refused with the field that is wrong, and changes nothing.
"""

from __future__ import annotations

import heapq

import attrs
from autobahn.twisted.wamp import ApplicationSession
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import CallOptions, RegisterOptions, SubscribeOptions
from twisted.internet import defer
from twisted.logger import Logger

from llmgw.answers import CordonAnswer, DrainAnswer, ReloadAnswer, WeightsAnswer
from llmgw.control import relay
from llmgw.control.claims import ClaimRefused, ModelSlots, peer_host
from llmgw.control.fleet import Fleet, NotRegistered, TooManyDownloads
from llmgw.control.heard import Heard
from llmgw.control.heard import interval as heard_interval
from llmgw.control.news import NewsSettings
from llmgw.control.nodelisting import NodeQuery
from llmgw.control.reconciler import Reconciler
from llmgw.control.reload import Listener, Outcome, reload_all
from llmgw.control.routing import endpoint_table
from llmgw.control.scaling import Scaling
from llmgw.engines.releases import engine_plan
from llmgw.ha.fence import no_ha
from llmgw.link import hub as hubmod
from llmgw.link import uris
from llmgw.records import CollectResult, EnginePlan, Heartbeat, Inventory, Progress, ShardSpec, ShardStatus
from llmgw.roles import ROLE_NODE
from llmgw.states import NodeState, ShardState
from llmgw.views import EndpointTable, EventKind, FleetStatus
from llmgw.wire import WireError, from_wire, to_wire

# How long a node may take to accept a start or stop before the call fails.
COMMAND_TIMEOUT_MS = 30_000
# Taking a new engine plan only starts the installs; the node answers at once.
SET_ENGINES_TIMEOUT_MS = 10_000
# What the router says when the callee is not there: an agent older than the procedure.
NO_SUCH_PROCEDURE = "wamp.error.no_such_procedure"

log = Logger()


#: The errors the control plane's procedures answer with on purpose, in words, each logged (if at all) where it is raised.
#: An operator's question about a node that is not there, or that does not answer, is answered, not logged: a
#: dashboard polling a forgotten node's log every 2 s wrote the server's log as often.
_ANSWERS = frozenset({uris.ERROR_REFUSED, uris.ERROR_INVALID_ARGUMENT, uris.ERROR_NOT_REGISTERED,
                      uris.ERROR_NO_SUCH_NODE, uris.ERROR_NOT_ANSWERING, uris.ERROR_STANDBY})
#: How many of the known nodes a refusal for an unknown one names.
KNOWN_SHOWN = 10


class ControlSession(ApplicationSession):
    def __init__(self, config, fleet_factory, catalog=None, clock=None):
        super().__init__(config)
        # The fleet emits through this session, so it is built once we can publish.
        self.fleet: Fleet = fleet_factory(self._emit)
        self.catalog = catalog
        self._table: EndpointTable | None = None
        # A shard's change reaches the routers in the same reactor turn's
        # end, not at the next tick: ctl saying ready and the router still
        # answering "starting" for up to a second surprised clients.
        self._table_soon = None
        # The last push of a changed engine plan to the nodes (tests wait on it).
        self.pushing: defer.Deferred | None = None
        # In-process consumers of the endpoint table and of reloaded
        # configuration (the server's own router).
        self.table_listeners: list = []
        self.reload_listeners: list[Listener] = []
        # In-process consumers of every fleet event, (kind, id, event), published or not: the download figures.
        self.event_listeners: list = []
        # Each session's address as the hub saw it connect (its on_join meta
        # event), so a node's engines are held to the address it really has.
        self._peers: dict[int, str] = {}
        # (node, record kind) whose last report was refused: logged once until a good one.
        self._refused_reports: set[tuple[str | None, str]] = set()
        # When each node session's certificate expires, from the same meta event.
        self._expiry: dict[int, float] = {}
        # Onboarding's signing and revoking (llmgw.control.identity), when the server sets one.
        self.identity = None
        # What else registers procedures on this session once it joins (the journal, the figures):
        # each has ``async register(session)``, as ``identity`` does.
        self.extensions: list = []
        # In-process consumers of every router's traffic report: (RouterLoad, router key, now).
        self.load_listeners: list = []
        # The leader's epoch every command that changes a node carries (llmgw.ha.fence): None without ha:.
        self.command_epoch = no_ha
        self.guard = lambda uri, endpoint: endpoint  # wraps each procedure registered (llmgw.process.ha: a standby's)
        self._configure_fleet()
        self._clock = clock if clock is not None else self.fleet._clock
        # The nodes heard since the last llmgw.event.heard, and the call that publishes the next.
        self.heard = Heard()
        self._heard_next = None
        self.reconciler = Reconciler(
            self._clock, self.fleet,
            lambda: self.catalog.entries if self.catalog is not None else {},
            self.start_shard, self.stop_shard,
            settle_s=catalog.config.fleet.settle_s if catalog is not None else 0.0,
            settle_quiet_s=catalog.config.fleet.settle_quiet_s if catalog is not None else 0.0,
            settle_max_s=catalog.config.fleet.settle_max_s if catalog is not None else None,
        )
        self.scaling = Scaling(self)  # llmgw.cp.router.load and llmgw.cp.scale
        self.extensions.append(self.scaling)

    def register(self, endpoint, procedure=None, *args, **kwargs):
        return super().register(self.guard(procedure, endpoint), procedure, *args, **kwargs)

    def onConnect(self):
        self.join(self.config.realm)

    def onUserError(self, fail, msg):
        # A refusal is the caller's answer, logged by whoever refused it on
        # its own terms (once per node and shard, once per full node, once per
        # node and record kind until a good one): not a line per call, which a
        # node could otherwise write at will.  "Register first" is what every
        # node hears once after a restart: ten thousand lines say nothing.
        value = getattr(fail, "value", None)
        if isinstance(value, ApplicationError) and value.error in _ANSWERS:
            return
        super().onUserError(fail, msg)

    def _configure_fleet(self) -> None:
        if self.catalog is not None:
            fleet = self.catalog.config.fleet
            self.fleet.configure(NewsSettings(fleet.node_event_interval_s, fleet.node_figures_change),
                                 fleet.downloads_per_node, (fleet.refusal_log_lines, fleet.refusal_log_window_s))

    async def onJoin(self, details):
        with_details = RegisterOptions(details_arg="details")
        await self.register(self.agent_register, uris.AGENT_REGISTER, with_details)
        await self.register(self.agent_heartbeat, uris.AGENT_HEARTBEAT, with_details)
        await self.register(self.agent_shard_status, uris.AGENT_SHARD_STATUS, with_details)
        await self.register(self.agent_progress, uris.AGENT_PROGRESS, with_details)
        await self.register(self.weights, uris.CP_WEIGHTS)
        await self.register(self.nodes, uris.CP_NODES)
        await self.register(self.node, uris.CP_NODE)
        await self.register(self.replicas, uris.CP_REPLICAS)
        await self.register(self.status, uris.CP_STATUS)
        await self.register(self.drain, uris.CP_DRAIN)
        await self.register(self.cordon, uris.CP_CORDON)
        await self.register(self.uncordon, uris.CP_UNCORDON)
        await self.register(self.reload, uris.CP_RELOAD)
        await self.register(lambda: to_wire(self.endpoint_table()), uris.ROUTER_ENDPOINTS)
        await self.register(self.logs, uris.CP_LOGS)
        if self.identity is not None:
            await self.identity.register(self)
        for extension in self.extensions:
            await extension.register(self)
        await self.subscribe(self._session_joined, hubmod.META_ON_JOIN, SubscribeOptions())
        await self.subscribe(self._session_left, hubmod.META_ON_LEAVE, SubscribeOptions())
        if self._heard_next is None:
            self._publish_heard()
        log.info("control plane attached to the hub")

    def _emit(self, kind: EventKind, ident: str, event) -> None:
        for listener in self.event_listeners:
            listener(kind, ident, event)
        if self.is_attached():
            self.publish(uris.EVENT_PREFIX + kind, ident, to_wire(event))
            if kind is EventKind.SHARD and self._table_soon is None:
                # Coalesced: every shard change of one turn, one table.
                self._table_soon = self._clock.callLater(0, self._publish_soon)

    def _publish_soon(self) -> None:
        self._table_soon = None
        self.publish_endpoints()

    @staticmethod
    def _node_caller(details) -> str:
        if details.caller_authrole != ROLE_NODE:
            raise ApplicationError(uris.ERROR_NOT_AUTHORIZED, f"{details.caller_authid} is not a node")
        return details.caller_authid

    def _decode(self, cls, payload, node_id: str | None = None):
        """*payload* as a *cls*, or the node is answered invalid_argument with the field path.

        The refusal is logged once per node and record kind until that
        node's next good one, so a node stuck on a bad figure writes one
        line, not one per heartbeat.
        """
        try:
            decoded = from_wire(cls, payload)
        except WireError as e:
            key = (node_id, cls.__name__)
            # Bounded like everything a node can make the control plane keep.
            if node_id is not None and key not in self._refused_reports and len(self._refused_reports) < 4096:
                self._refused_reports.add(key)
                log.warn("refused a {kind} from {node}: {why}", kind=cls.__name__, node=node_id, why=relay.words(str(e)))
            raise ApplicationError(uris.ERROR_INVALID_ARGUMENT, str(e)) from None
        self._refused_reports.discard((node_id, cls.__name__))
        return decoded

    def agent_register(self, inventory, details=None):
        node_id = self._node_caller(details)
        inv = self._decode(Inventory, inventory, node_id)
        if inv.node_id != node_id:
            log.warn(
                "node {id} registered an inventory naming {other}; its certificate wins",
                id=node_id, other=inv.node_id,
            )
            inv = attrs.evolve(inv, node_id=node_id)
        catalog = None if self.catalog is None else {
            name: ModelSlots.of(name, entry) for name, entry in self.catalog.entries.items()}
        refused = self.fleet.register(node_id, details.caller, inv, peer=self._peers.get(details.caller),
                                     certificate_not_after=self._expiry.get(details.caller),
                                     catalog=catalog)
        for shard_id in refused:
            # Running but not believed: a copy of a slot served elsewhere, or
            # of a model no longer in the catalog, is stopped, as the
            # reconciler would have stopped it once adopted.
            defer.ensureDeferred(self._stop_refused(node_id, shard_id))
        answer = {"node_id": node_id}
        if (epoch := relay.register_epoch(self, node_id, inv.fencing)) is not None:
            answer[uris.EPOCH] = epoch
        if refused:
            answer["refused"] = refused
        plan = self.engine_plan()
        if plan is not None:
            # The builds it is to install; an agent older than installs ignores the key.
            answer["engines"] = to_wire(plan)
        return answer

    async def _stop_refused(self, node_id: str, shard_id: str) -> None:
        try:
            await self.call(uris.node_uri(node_id, uris.NODE_STOP_SHARD), shard_id,
                            options=CallOptions(timeout=COMMAND_TIMEOUT_MS),
                            **relay.fenced(self, node_id))
        except Exception as e:
            if self.fleet.claims.may_log(node_id):  # a line per invented id would be the node's to write
                log.info("asked {node} to stop {shard}, whose report was refused; it did not ({e})",
                         node=node_id, shard=shard_id,
                         e=relay.words(e.args[0] if isinstance(e, ApplicationError) and e.args else e))

    def direct_procedures(self) -> dict:
        """What the hub answers by calling straight in (``Hub.attach_local``): the heartbeat, synchronous and the most frequent call."""
        return {uris.AGENT_HEARTBEAT: self.agent_heartbeat}

    def agent_heartbeat(self, beat, details=None):
        node_id = self._node_caller(details)
        try:
            self.fleet.heartbeat(node_id, details.caller, self._decode(Heartbeat, beat, node_id))
        except NotRegistered:
            raise ApplicationError(uris.ERROR_NOT_REGISTERED, f"{node_id} must register first") from None
        self.heard.noted(node_id)

    def _publish_heard(self) -> None:
        """Every few seconds, one ``llmgw.event.heard`` for the nodes heard since the last (``llmgw.control.heard``)."""
        self._heard_next = self._clock.callLater(heard_interval(self.fleet.unreachable_after), self._publish_heard)
        nodes = self.fleet.nodes
        events = self.heard.batch(lambda node_id: getattr(nodes.get(node_id), "last_seen", None), self._clock.seconds())
        if self.is_attached():
            for event in events:
                self.publish(uris.EVENT_HEARD, to_wire(event))

    def agent_shard_status(self, status, details=None):
        node_id = self._node_caller(details)
        decoded = self._decode(ShardStatus, status, node_id)
        try:
            self.fleet.shard_status(node_id, decoded)
        except NotRegistered:
            raise ApplicationError(uris.ERROR_NOT_REGISTERED, f"{node_id} must register first") from None
        except ClaimRefused as e:
            raise ApplicationError(uris.ERROR_REFUSED, str(e)) from None

    def agent_progress(self, progress, details=None):
        node_id = self._node_caller(details)
        try:
            self.fleet.download(node_id, self._decode(Progress, progress, node_id))
        except NotRegistered:
            raise ApplicationError(uris.ERROR_NOT_REGISTERED, f"{node_id} must register first") from None
        except TooManyDownloads as e:
            raise ApplicationError(uris.ERROR_REFUSED, str(e)) from None

    # -- operators --

    async def weights(self, collect=False):
        """Per node, the weights llmgw fetched that no model in the catalog wants; with *collect*, ask to remove them."""
        from llmgw.control.weights import unwanted_by_node

        wanted = [m.source for m in self.catalog.config.models.values()] if self.catalog is not None else []
        found = unwanted_by_node(self.fleet, wanted)
        results = {}
        if collect:
            for node_id, files in found.items():
                if not files or self.fleet.nodes[node_id].state != NodeState.READY:
                    continue
                answer = await relay.ask(self, node_id, uris.NODE_COLLECT_WEIGHTS, [f.path for f in files],
                                         timeout_ms=COMMAND_TIMEOUT_MS, fence=True)
                results[node_id] = relay.answer(node_id, uris.NODE_COLLECT_WEIGHTS, CollectResult, answer)
        return to_wire(WeightsAnswer(unwanted=found, collected=results if collect else None))

    # What operators are answered is a record (``llmgw.views``, ``llmgw.answers``) in its wire form.

    def nodes(self, state=None, label=None, after=None, limit=None, brief=False):
        """The nodes in id order, all of them or those in *state*, with *label* (KEY=VALUE), a page at a time.

        A page is at most *limit* nodes after the id *after*; the next page
        starts after the last id of this one.  Without *limit*, every node
        that matches, as before paging.  *brief*: each node as ``ctl nodes``'
        table shows it (``NodeBrief``) rather than its whole view.
        """
        try:
            query = NodeQuery.parse(state, label, after, limit)
            if not isinstance(brief, bool):
                raise ValueError(f"brief {brief!r} is not true or false")
        except ValueError as e:
            raise ApplicationError(uris.ERROR_INVALID_ARGUMENT, f"llmgw.cp.nodes: {e}") from None
        return self.fleet.json_listing(query, brief=brief)

    def node(self, node_id):
        """*node_id*'s view (``NodeView``), or None when the fleet has none: one node, whatever the fleet's size."""
        if not isinstance(node_id, str):
            raise ApplicationError(uris.ERROR_INVALID_ARGUMENT, f"llmgw.cp.node: a node's id is a string, not "
                                   f"{type(node_id).__name__}")
        node = self.fleet.nodes.get(node_id)
        return None if node is None else to_wire(node.view(self._clock.seconds()))

    def replicas(self):
        return to_wire(self.reconciler.views())

    def status(self):
        states = sorted({n.state for n in self.fleet.nodes.values()})
        return to_wire(FleetStatus(self.reconciler.status(), {
            state: sum(1 for n in self.fleet.nodes.values() if n.state == state) for state in states
        }))

    def _known(self, node_id):
        if node_id not in self.fleet.nodes:
            nodes = self.fleet.nodes
            more = len(nodes) - KNOWN_SHOWN
            known = (", ".join(heapq.nsmallest(KNOWN_SHOWN, nodes)) + (f" and {more} more" if more > 0 else "")
                     if nodes else "none have registered")
            raise ApplicationError(uris.ERROR_NO_SUCH_NODE, f"no node {relay.words(repr(node_id))} (known: {known}; "
                                   "`llmgw ctl nodes` lists them all)")

    async def cordon(self, node_id, cordoned=True):
        self._known(node_id)
        # The agent keeps the cordon in its state directory, so it outlives
        # this process, which keeps no database.
        await relay.ask(self, node_id, uris.NODE_CORDON, bool(cordoned), timeout_ms=COMMAND_TIMEOUT_MS, fence=True)
        self.fleet.set_cordoned(node_id, bool(cordoned))
        return to_wire(CordonAnswer(node_id, bool(cordoned)))

    async def uncordon(self, node_id):
        return await self.cordon(node_id, False)

    async def drain(self, node_id):
        """Cordon a node and stop its shards; the reconciler places them elsewhere."""
        await self.cordon(node_id, True)
        shards = [s for s in self.fleet.shards.values() if s.node_id == node_id and s.status.state != ShardState.FAILED]
        for shard in shards:
            await relay.ask(self, node_id, uris.NODE_DRAIN_SHARD, shard.id, timeout_ms=COMMAND_TIMEOUT_MS, fence=True)
        for shard in shards:
            await self.stop_shard(node_id, shard.id)
        return to_wire(DrainAnswer(node_id, True, [s.id for s in shards]))

    def reload(self):
        """`ctl reload`: the changes applied, or the refusal as the call's error."""
        outcome = self.apply_reload()
        if outcome.refused is not None:
            raise ApplicationError(uris.ERROR_CONFIG, outcome.refused)
        return to_wire(ReloadAnswer(list(outcome.changes)))

    def apply_reload(self) -> Outcome:
        """SIGHUP and `ctl reload`: server.yaml again, to the catalog and every reload listener or to none.

        A reload that changes the engine plan is sent to every ready node; a
        node that does not take it is logged, and gets the plan again when it
        next registers.
        """
        if self.catalog is None:
            return Outcome(refused="this control plane has no catalog to reload")
        before = self.engine_plan()
        outcome = reload_all(self.catalog, self.reload_listeners)
        if outcome.refused is None:
            self._configure_fleet()
            self.reconciler.elastic.scaler.unpin_all()  # `ctl scale` pins last until the next reload
            plan = self.engine_plan()
            if plan != before:
                self.pushing = defer.ensureDeferred(self.push_engines(plan))
            self.reconciler.tick()
            # At once, not at the next tick: a model the reload adds asleep is held by the routers, not 503.
            self.publish_endpoints()
        return outcome

    # -- engine builds --

    def engine_plan(self) -> EnginePlan | None:
        """The builds every node is to install; None without a catalog (nothing to ask of a node)."""
        return engine_plan(self.catalog.config) if self.catalog is not None else None

    async def push_engines(self, plan: EnginePlan) -> None:
        """Tell every ready node *plan*, all at once; never fails, whatever the nodes answer."""
        ready = sorted(n.id for n in self.fleet.nodes.values() if n.state == NodeState.READY)
        log.info("the engine plan changed: telling {n} ready node(s)", n=len(ready))
        wire = to_wire(plan)
        await defer.DeferredList([defer.ensureDeferred(self._set_engines(node_id, wire)) for node_id in ready],
                                 consumeErrors=True)

    async def _set_engines(self, node_id: str, plan) -> None:
        try:
            await self.call(uris.node_uri(node_id, uris.NODE_SET_ENGINES), plan,
                            options=CallOptions(timeout=SET_ENGINES_TIMEOUT_MS), **relay.fenced(self, node_id))
        except Exception as e:
            if isinstance(e, ApplicationError) and e.error == NO_SUCH_PROCEDURE:
                log.info("{id} has no set_engines (an agent older than engine installs, or one that has just left); "
                         "it keeps what it has until it registers again", id=node_id)
                return
            why = e.args[0] if isinstance(e, ApplicationError) and e.args else f"{type(e).__name__}: {e}"
            log.warn("{id} did not take the new engine plan ({why}); it is sent again when it next registers",
                     id=node_id, why=relay.words(why))

    async def logs(self, node_id, source=None, n=200):
        """A node's log lines (``LogsAnswer``), checked and relayed; a node that does not answer in 10 s says so."""
        self._known(node_id)
        n = relay.lines_asked(n)
        self._started(node_id, source)
        answer = await relay.ask(self, node_id, uris.NODE_LOGS, source, n, timeout_ms=relay.LOGS_TIMEOUT_MS)
        return to_wire(relay.logs(node_id, answer, n))

    def _started(self, node_id, source) -> None:
        """Refuse, without asking *node_id*, a log of a shard it holds and has not started (still fetching).

        The node has no log for it yet; asking it every poll of a dashboard
        made it log a refusal each time.
        """
        held = self.fleet.shards.get((node_id, source)) if isinstance(source, str) else None
        if held is None or held.status.state != ShardState.FETCHING:
            return
        doing = f" ({relay.words(held.status.reason)})" if held.status.reason else ""
        raise ApplicationError(uris.ERROR_REFUSED, (
            f"{source} on {node_id} has not started: it is fetching its weights{doing}; its log begins when its "
            "engine starts (`llmgw ctl replicas` shows the download)"))

    # -- the routers' endpoint table --

    def endpoint_table(self) -> EndpointTable:
        """Ready replicas the routers may send to, and why the other models have none."""
        catalog = self.catalog.entries if self.catalog is not None else {}
        reconciler = self.reconciler
        return endpoint_table(self.fleet, {name: entry.model.replicas for name, entry in catalog.items()},
                              reconciler.views, reconciler.withdrawn(), reconciler.elastic.cold_starts(catalog),
                              [name for name, entry in catalog.items() if not entry.model.continuation])

    def publish_endpoints(self, force: bool = False) -> None:
        """Tell routers the table when it changes (each tick calls this); with *force*, even when it has not."""
        table = self.endpoint_table()
        if table == self._table and not force:
            return
        self._table = table
        for listener in self.table_listeners:
            try:
                listener(table)
            except Exception:
                log.failure("an endpoint table listener failed")
        if self.is_attached():
            self.publish(uris.EVENT_ENDPOINTS, to_wire(table))

    # -- commands to agents --

    async def start_shard(self, node_id: str, spec: ShardSpec):
        result = await self.call(uris.node_uri(node_id, uris.NODE_START_SHARD), to_wire(spec),
                                 options=CallOptions(timeout=COMMAND_TIMEOUT_MS), **relay.fenced(self, node_id))
        status = self._decode(ShardStatus, result)
        try:
            self.fleet.shard_status(node_id, status)
        except ClaimRefused as e:
            raise ApplicationError(uris.ERROR_REFUSED, str(e)) from None
        return status

    async def stop_shard(self, node_id: str, shard_id: str):
        result = await relay.ask(self, node_id, uris.NODE_STOP_SHARD, shard_id, timeout_ms=COMMAND_TIMEOUT_MS, fence=True)
        if result is not None:
            self.fleet.shard_status(node_id, relay.answer(node_id, uris.NODE_STOP_SHARD, ShardStatus, result))
        else:
            self.fleet.forget_shard(node_id, shard_id)

    def _session_joined(self, info):
        if isinstance(info, dict) and info.get("authrole") == ROLE_NODE:
            self.fleet.node_joined()
        host = peer_host((info.get("transport") or {}).get("peer")) if isinstance(info, dict) else None
        if host is not None and info.get("authrole") == ROLE_NODE:
            self._peers[info["session"]] = host
        expires = (info.get("certificate") or {}).get("not_after") if isinstance(info, dict) else None
        if isinstance(expires, (int, float)) and info.get("authrole") == ROLE_NODE:
            self._expiry[info["session"]] = float(expires)

    def _session_left(self, info):
        self._peers.pop(info.get("session"), None)
        self._expiry.pop(info.get("session"), None)
        if info.get("authrole") == ROLE_NODE:
            self.fleet.link_closed(info["session"])
