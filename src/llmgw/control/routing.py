"""The routers' endpoint table: where each model's traffic may go, from the fleet's facts.

A replica is routed to when every shard of it on a node that is not lost
reports ``ready``, and then at the endpoint its rank 0 reports, on rank 0's
node.  That is read from what the nodes said, never from the replica views
``ctl replicas`` shows: a change to how a view reads (a reason's wording, an
age) cannot move traffic.  Only the words of ``unavailable``, the 503 a
client gets for a model with no endpoint, are the views' reasons.
"""

from __future__ import annotations

from typing import Iterable

from llmgw.control.fleet import Fleet
from llmgw.states import ShardState
from llmgw.views import EndpointEntry, EndpointTable, ReplicaView


def endpoint_table(fleet: Fleet, catalog: Iterable[str], views: Iterable[ReplicaView]) -> EndpointTable:
    """The ready replicas of the models in *catalog*, and why each other model has none.

    Entries come in the order of *views* and the reasons in catalog order, as
    the table always listed them, so its wire form did not change.
    """
    catalog = list(catalog)
    views = list(views)
    wanted = set(catalog)
    endpoints = []
    for replica_id, shards in sorted(fleet.replicas().items()):
        usable = [s for s in shards if fleet.usable(s.node_id)]
        model = replica_id.rpartition("/")[0]
        if not usable or model not in wanted:
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
    order = {view.replica: index for index, view in enumerate(views)}
    endpoints.sort(key=lambda e: (order.get(e.id, len(order)), e.id))
    served = {e.model for e in endpoints}
    unavailable: dict[str, str] = {}
    for view in views:
        if view.model in wanted and view.model not in served and view.model not in unavailable:
            unavailable[view.model] = view.reason or f"its replica is {view.state}"
    for name in catalog:
        if name not in served and name not in unavailable:
            unavailable[name] = "the catalog asks for no replicas of it"
    return EndpointTable(endpoints, unavailable)
