"""``ctl replicas`` with elastic replicas (issue 28): a sleeping one and one waking on demand read as what they are."""

from __future__ import annotations

from llmgw.ctl.tables import replicas_table
from llmgw.states import ReplicaState
from llmgw.views import ReplicaView, ShardView


def test_a_sleeping_replica_has_no_node_and_says_why_and_a_waking_one_says_what_waits():
    shown = replicas_table([
        ReplicaView("llama", "llama/0", ReplicaState.SLEEPING, reason="idle: scaled to zero, last request 14 min ago"),
        ReplicaView("mistral", "mistral/0", ReplicaState.STARTING, nodes=["gpu01"], age_s=12, stale=False,
                    reason="starting on demand: 3 requests waiting, 12 s",
                    shards=[ShardView("mistral/0/0", node="gpu01", state="starting", rank=0)]),
    ]).splitlines()
    assert shown == [
        "MODEL    REPLICA    STATE     NODES  ENDPOINT  AGE  STALE",
        "llama    llama/0    sleeping  -      -         -",
        "    idle: scaled to zero, last request 14 min ago",
        "mistral  mistral/0  starting  gpu01  -         12s",
        "    starting on demand: 3 requests waiting, 12 s",
    ]
