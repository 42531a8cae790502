"""What a node may say it runs: the shards the control plane placed on it, or adopted from it by rule.

A node's certificate says who it is, not what it serves.  So every shard a
node reports — in ``shard_status``, in a start's answer, in register's list —
is held against a *grant*: the control plane's own record that this node
runs this shard.  A grant is made when the reconciler places a shard on a
node, or when a node registers with a shard the control plane did not place
(it restarted, or the shard outlived a lost node) and the adoption rule
accepts it; it ends when the shard is forgotten.  Each grant carries its
arrival order at the control plane, which is what decides between two copies
of one slot: never a time the node sends.

The adoption rule, and the endpoint rule every report is held to, are
written out for operators in docs/security.rst ("What a node may claim").
"""

from __future__ import annotations

import collections
import enum
import ipaddress
import itertools
from typing import TYPE_CHECKING, Callable, Mapping
from urllib.parse import urlsplit

import attrs
from twisted.logger import Logger

from llmgw.control import adoption
from llmgw.control.lograte import LINES, WINDOW_S, LogBudget
from llmgw.control.placement import PlacementRequest
from llmgw.records import Inventory, ShardSpec, ShardStatus
from llmgw.states import ShardState

if TYPE_CHECKING:
    from llmgw.control.catalog import Entry

log = Logger()

# An agent gives each engine a port from agent.yaml's engine_ports (20000-29999
# by default, far above this); the ports below are system services, never an
# engine llmgw started.
MIN_ENGINE_PORT = 1024
# Refusals logged once per (node, shard), within each node's budget of lines
# (lograte); this many pairs are remembered.
LOGGED_MAX = 4096


class Why(enum.Enum):
    """Why a claim was refused: the ``reason`` label of ``llmgw_node_claims_refused_total``."""

    NOT_PLACED = "not placed"
    SPEC = "spec"
    SLOT_HELD = "slot held"
    NOT_IN_CATALOG = "not in catalog"
    ENDPOINT = "endpoint"
    RENDEZVOUS = "rendezvous"
    PROFILE = "profile"


class ClaimRefused(Exception):
    """A node's report the control plane does not believe; the message names the node, the shard and why."""

    def __init__(self, node_id: str, shard_id: str, why: Why, words: str):
        super().__init__(f"{node_id} may not report {shard_id}: {words}")
        self.node_id, self.shard_id, self.why = node_id, shard_id, why


@attrs.frozen
class ModelSlots:
    """What the catalog asks of one model: the slots an adopted shard may fill."""

    replicas: int
    ranks: int
    # What one rank asks of its node (the model's profile); None: adoption is not held to placement.
    request: PlacementRequest | None = None

    @classmethod
    def of(cls, name: str, entry: Entry) -> ModelSlots:
        """The slots of the catalog's *entry* for the model *name*, with the request placement would make."""
        request = PlacementRequest.from_profile(name, entry.profile, entry.engine_version)
        return cls(entry.model.replicas, entry.profile.ranks, request)


@attrs.frozen
class Grant:
    """The control plane's record that *node_id* runs the shard of *spec*."""

    node_id: str
    spec: ShardSpec  # as placed, or as the node reported it when adopted
    order: int  # arrival order at the control plane: the earlier grant is the older copy
    adopted: bool = False


def _identity(spec: ShardSpec) -> tuple:
    return spec.shard_id, spec.replica_id, spec.model, spec.rank, spec.ranks


def _holding(spec: ShardSpec) -> tuple:
    """What a shard holds on its node: placement counted it on these, and a later report may not move them."""
    return spec.engine, sorted(spec.gpus)


def spec_refusal(spec: ShardSpec) -> str | None:
    """Why *spec* does not name one rank of one slot consistently; None when it does.

    Routing and the reconciler group shards by ``replica_id`` and pick by
    ``rank``: a spec whose id says one slot and whose fields another would
    let a grant for one shard speak for another.
    """
    model, _, index = spec.replica_id.rpartition("/")
    if model != spec.model or not index.isdigit():
        return f"its replica id {spec.replica_id!r} is not {spec.model}/N"
    if not 0 <= spec.rank < spec.ranks:
        return f"rank {spec.rank} of {spec.ranks} is not a rank of a replica"
    if spec.shard_id != f"{spec.replica_id}/{spec.rank}":
        return f"its shard id is not {spec.replica_id}/{spec.rank}, its replica and rank"
    return None


def host_of(text: str) -> str:
    """An address in one spelling: IPv6 compressed, an IPv4-mapped one as IPv4, a name in lower case."""
    bare = text.strip("[]")
    try:
        ip = ipaddress.ip_address(bare)
    except ValueError:
        return bare.lower()
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip)


def peer_host(peer: str | None) -> str | None:
    """The host of a WAMP transport's peer ("tcp4:10.0.0.5:51234", "tcp6:::1:51234"); None for any other kind."""
    if not peer:
        return None
    kind, _, rest = peer.partition(":")
    if kind not in ("tcp4", "tcp6"):
        return None
    host, _, port = rest.rpartition(":")
    return host_of(host) if host and port.isdigit() else None


def endpoint_refusal(endpoint: str, node_id: str, address: str | None) -> str | None:
    """Why the router must not be sent to *endpoint* for *node_id*; None when it may.

    An engine's endpoint is ``http://HOST:PORT`` with HOST the node's own
    address (the one its link to the hub comes from): otherwise any node
    could point the router at any host and port.
    """
    shape = f"an engine's endpoint is http://HOST:PORT on its node's own address, not {endpoint!r}"
    if not _bare(endpoint):
        return shape
    try:
        parts = urlsplit(endpoint)
        port = parts.port
    except ValueError:
        return shape
    if (parts.scheme != "http" or not parts.hostname or parts.username is not None or parts.password is not None
            or parts.path or parts.query or parts.fragment or "#" in endpoint or "?" in endpoint):
        return shape
    return _off_node(endpoint, parts.hostname, port, node_id, address, "a node's engines listen on its own address")


def rendezvous_refusal(rendezvous: str, spec: ShardSpec, node_id: str, address: str | None) -> str | None:
    """Why the other ranks of *spec*'s replica must not be sent to *rendezvous*; None when they may.

    Rank 0 reports ``HOST:PORT`` (``[V6]:PORT``) where the other ranks join
    it, and they are started with it as their leader: HOST must be rank 0's
    node's own address, or any node could send a replica's ranks to any host.
    """
    if spec.rank != 0:
        return f"only rank 0 of a replica reports a rendezvous, and this is rank {spec.rank}"
    shape = f"a rendezvous is HOST:PORT ([V6]:PORT for IPv6) on its node's own address, not {rendezvous!r}"
    if not _bare(rendezvous):
        return shape
    host, _, port = rendezvous.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        if ":" not in host:
            return shape
    elif ":" in host:
        return shape
    if not host or not (port.isascii() and port.isdigit()) or len(port) > 5 or any(c in host for c in "/@[] "):
        return shape
    return _off_node(rendezvous, host, int(port), node_id, address,
                     "the other ranks of its replica are sent there, and it must be rank 0's own node")


def _bare(text: str) -> bool:
    """Printable, with nothing around it: urlsplit would quietly drop a leading space, and the router could not."""
    return text.isprintable() and text == text.strip()


def _off_node(what: str, host: str, port: int | None, node_id: str, address: str | None, why: str) -> str | None:
    """Why *what* (at *host*:*port*) is not a port a node's engine may be on; None when it is."""
    if port is None or not MIN_ENGINE_PORT <= port <= 65535:
        return f"{what} does not name a port from {MIN_ENGINE_PORT} to 65535, which is where agents put engines"
    if address is None:
        return f"{node_id} has no known address to check {what} against"
    if host_of(host) != host_of(address):
        return f"{what} is not on {node_id}'s own address {address}: {why}"
    return None


class Claims:
    """The grants, and the refusals: counted per (node, why), logged once per (node, shard) within a budget.

    A node may cause *log_lines* refusal lines every *log_window_s* seconds of
    *clock*; the rest are counted and summed up in one line per window, so
    inventing shard ids cannot fill the server's disk.
    """

    def __init__(self, clock, log_lines: int = LINES, log_window_s: float = WINDOW_S):
        self.grants: dict[tuple[str, str], Grant] = {}
        # The grants again, by replica and by node: an adoption looks at its slot's and its node's, never at all
        # of them (a register of 1024 shards against a fleet's grants was a million steps).
        self._by_replica: dict[str, dict[tuple[str, str], None]] = {}
        self._by_node: dict[str, dict[str, None]] = {}
        self._order = itertools.count(1)
        self._logged: collections.OrderedDict[tuple[str, str], None] = collections.OrderedDict()
        self.log_budget = LogBudget(clock, "refused claims", log_lines, log_window_s)
        self.refused: collections.Counter[tuple[str, Why]] = collections.Counter()

    def may_log(self, node_id: str) -> bool:
        """Whether another line about *node_id*'s refused claims fits its budget now (counted if not)."""
        return self.log_budget.allow(node_id)

    def place(self, node_id: str, spec: ShardSpec) -> Grant:
        """The reconciler puts *spec* on *node_id*: what the node then reports of it is believed."""
        return self._put(Grant(node_id, spec, next(self._order)))

    def drop(self, node_id: str, shard_id: str) -> None:
        grant = self.grants.pop((node_id, shard_id), None)
        if grant is None:
            return
        for index, key, member in ((self._by_replica, grant.spec.replica_id, (node_id, shard_id)),
                                   (self._by_node, node_id, shard_id)):
            held = index.get(key)
            if held is not None:
                held.pop(member, None)
                if not held:
                    del index[key]

    def _put(self, grant: Grant) -> Grant:
        shard_id = grant.spec.shard_id
        self.drop(grant.node_id, shard_id)
        self.grants[(grant.node_id, shard_id)] = grant
        self._by_replica.setdefault(grant.spec.replica_id, {})[(grant.node_id, shard_id)] = None
        self._by_node.setdefault(grant.node_id, {})[shard_id] = None
        return grant

    def check(
        self,
        node_id: str,
        status: ShardStatus,
        address: str | None,
        *,
        adopting: bool = False,
        catalog: Mapping[str, ModelSlots] | None = None,
        usable: Callable[[str], bool] = lambda node_id: True,
        inventory: Inventory | None = None,
    ) -> Grant:
        """The grant *status* is reported under, made now when *adopting* it is allowed; else ``ClaimRefused``.

        *catalog* is the models adoption is allowed for, with their slots
        (None: no catalog to hold it to); *usable* says whether a node's
        grants still serve; *inventory* is what the adopting node registered
        with, which an adoption is held to as placement would hold it.
        """
        spec = status.spec
        shard_id = spec.shard_id
        bad = spec_refusal(spec)
        if bad is not None:
            raise self._refuse(node_id, shard_id, Why.SPEC, bad)
        grant = self.grants.get((node_id, shard_id))
        if grant is None and not adopting:
            raise self._refuse(node_id, shard_id, Why.NOT_PLACED,
                               f"the control plane did not place it on {node_id}; a node reports only the shards "
                               "it was asked to run, or offers others for adoption when it registers")
        if grant is not None and _identity(grant.spec) != _identity(spec):
            raise self._refuse(node_id, shard_id, Why.SPEC,
                               f"it was placed as {_words(grant.spec)}, and is reported as {_words(spec)}")
        if grant is not None and _holding(grant.spec) != _holding(spec):
            raise self._refuse(node_id, shard_id, Why.SPEC,
                               f"it was {'accepted' if grant.adopted else 'placed'} on {_on(grant.spec)}, "
                               f"and is reported on {_on(spec)}")
        if grant is None:
            self._adoptable(node_id, spec, catalog, usable)
            self._placeable(node_id, spec, catalog, inventory)
        if status.endpoint is not None:
            bad = endpoint_refusal(status.endpoint, node_id, address)
            if bad is not None:
                raise self._refuse(node_id, shard_id, Why.ENDPOINT, bad)
        if status.rendezvous is not None:
            bad = rendezvous_refusal(status.rendezvous, spec, node_id, address)
            if bad is not None:
                raise self._refuse(node_id, shard_id, Why.RENDEZVOUS, bad)
        if grant is None:
            grant = self._put(Grant(node_id, spec, next(self._order), adopted=True))
            log.info("{node} runs {shard}, which this control plane did not place: adopted", node=node_id,
                     shard=shard_id)
        return grant

    def _adoptable(self, node_id: str, spec: ShardSpec, catalog: Mapping[str, ModelSlots] | None,
                   usable: Callable[[str], bool]) -> None:
        if catalog is not None:
            slots = catalog.get(spec.model)
            if slots is None:
                raise self._refuse(node_id, spec.shard_id, Why.NOT_IN_CATALOG,
                                   f"the catalog has no model {spec.model!r}, so there is no slot to adopt it into")
            index = int(spec.replica_id.rpartition("/")[2])
            if index >= slots.replicas or spec.ranks != slots.ranks:
                raise self._refuse(node_id, spec.shard_id, Why.NOT_IN_CATALOG,
                                   f"the catalog asks for {slots.replicas} replica(s) of {spec.model} with "
                                   f"{slots.ranks} rank(s) each, and this is {_words(spec)}")
        for holder, shard_id in list(self._by_replica.get(spec.replica_id, ())):
            grant = self.grants[(holder, shard_id)]
            if holder == node_id or not usable(holder):
                continue
            if shard_id == spec.shard_id:
                raise self._refuse(node_id, spec.shard_id, Why.SLOT_HELD,
                                   f"{holder} already serves it, and the control plane {_how(grant)} there first")
            if grant.spec.replica_id == spec.replica_id and grant.spec.ranks != spec.ranks:
                raise self._refuse(node_id, spec.shard_id, Why.SPEC,
                                   f"its replica {spec.replica_id} runs with {grant.spec.ranks} rank(s) "
                                   f"({holder} serves {shard_id}), not {spec.ranks}")

    def _placeable(self, node_id: str, spec: ShardSpec, catalog: Mapping[str, ModelSlots] | None,
                   inventory: Inventory | None) -> None:
        """Refuse an adoption placement could not have made: the node lacks what the model's profile requires."""
        slots = None if catalog is None else catalog.get(spec.model)
        if slots is None or slots.request is None or inventory is None:
            return
        running = {s.spec.shard_id for s in inventory.shards or () if s.state != ShardState.STOPPED}
        others = [adoption.reservation(g.spec, getattr(catalog.get(g.spec.model), "request", None))
                  for g in (self.grants[(node_id, shard_id)] for shard_id in self._by_node.get(node_id, ()))
                  if g.spec.shard_id != spec.shard_id and g.spec.shard_id in running]
        why = adoption.misfit(node_id, inventory, spec, slots.request, others)
        if why is not None:
            raise self._refuse(node_id, spec.shard_id, Why.PROFILE,
                               f"placement would not have put it there ({node_id}: {why}); "
                               f"the catalog's profile for {spec.model} decides where it runs")

    def _refuse(self, node_id: str, shard_id: str, why: Why, words: str) -> ClaimRefused:
        refused = ClaimRefused(node_id, shard_id, why, words)
        self.refused[(node_id, why)] += 1
        key = (node_id, shard_id)
        if key in self._logged:
            self._logged.move_to_end(key)
        elif self.log_budget.allow(node_id):
            self._logged[key] = None
            if len(self._logged) > LOGGED_MAX:
                self._logged.popitem(last=False)
            log.warn("refused: {refused} (said once per node and shard)", refused=str(refused))
        return refused


def _words(spec: ShardSpec) -> str:
    return f"rank {spec.rank} of {spec.ranks} of {spec.replica_id} ({spec.model})"


def _on(spec: ShardSpec) -> str:
    gpus = f"GPUs {', '.join(map(str, sorted(spec.gpus)))}" if spec.gpus else "no GPUs"
    return f"{spec.engine} with {gpus}"


def _how(grant: Grant) -> str:
    return "accepted it" if grant.adopted else "placed it"
