"""The routers' endpoint table: where each model's traffic may go, from the fleet's facts.

A replica is routed to when every shard of it on a node that is not lost
reports ``ready``, and then at the endpoint its rank 0 reports, on rank 0's
node.  That is read from what the nodes said, never from the replica views
``ctl replicas`` shows: a change to how a view reads (a reason's wording, an
age) cannot move traffic.  Only the words of ``unavailable``, the 503 a
client gets for a model with no endpoint, are the views' reasons.
"""

from __future__ import annotations

from typing import Callable, Collection, Iterable, Mapping

from llmgw.control.fleet import Fleet
from llmgw.states import ShardState
from llmgw.views import ColdStart, EndpointEntry, EndpointTable, ReplicaView


def endpoint_table(fleet: Fleet, catalog: Mapping[str, int],
                   views: Callable[[Collection[str]], Iterable[ReplicaView]],
                   withdrawn: Collection[str] = (), elastic: Mapping[str, ColdStart] | None = None,
                   no_continuation: Collection[str] = ()) -> EndpointTable:
    """The ready replicas of the models in *catalog* (each with its replica count), and why each other model has none.

    Entries come in the order ``ctl replicas`` lists their replicas (by
    model, then slot; a slot past the catalog's count after them) and the
    reasons in catalog order, as the table always listed them, so its wire
    form did not change.  *views(models)* gives the replica views of those
    models; it is asked only for the models with no endpoint, whose reasons
    it holds: the control plane makes this table every second, and making
    every replica's view each time was most of that second's pass at 200
    replicas (a 30 ms turn of the reactor, the tail of every heartbeat
    behind it).  *withdrawn* replicas are being drained (scaled down): ready,
    and sent nothing new.  *elastic* is what routers hold requests by for
    the models that may have no replica (``EndpointTable.elastic``).
    """
    endpoints = []
    for replica_id, shards in sorted(fleet.replicas().items()):
        usable = [s for s in shards if fleet.usable(s.node_id)]
        model = replica_id.rpartition("/")[0]
        if not usable or model not in catalog or replica_id in withdrawn:
            continue
        if any(s.status.state != ShardState.READY for s in usable):
            continue
        # A multi-node replica serves only with every rank: one whose node is
        # lost is not a smaller replica but a broken one.
        if len({s.status.spec.rank for s in usable}) < usable[0].status.spec.ranks:
            continue
        leader = min(usable, key=lambda s: s.status.spec.rank)
        if leader.status.spec.rank == 0 and leader.status.endpoint:
            endpoints.append(EndpointEntry(replica_id, model, leader.status.endpoint, leader.node_id))
    endpoints.sort(key=lambda e: _listed(e.id, catalog))
    served = {e.model for e in endpoints}
    unserved = [name for name in catalog if name not in served]
    unavailable: dict[str, str] = {}
    for view in views(set(unserved)) if unserved else ():
        if view.model in catalog and view.model not in served and view.model not in unavailable:
            unavailable[view.model] = view.reason or f"its replica is {view.state}"
    for name in unserved:
        if name not in unavailable:
            unavailable[name] = "the catalog asks for no replicas of it"
    return EndpointTable(endpoints, unavailable, dict(elastic or {}), sorted(no_continuation))


def _listed(replica_id: str, catalog: Mapping[str, int]) -> tuple:
    """Where ``ctl replicas`` lists *replica_id*: the catalog's slots by model and slot, then the others by id."""
    model, _, slot = replica_id.rpartition("/")
    if slot.isdigit() and int(slot) < catalog.get(model, 0):
        return (0, model, int(slot))
    return (1, replica_id)
