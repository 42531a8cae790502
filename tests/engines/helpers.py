"""What the engine tests build their shards from."""

from __future__ import annotations

from llmgw.records import ShardSpec


def shard(engine: str, *, model: str = "qwen", replica: int = 0, rank: int = 0, **fields) -> ShardSpec:
    """A ShardSpec as the control plane would send it, with the ids derived."""
    fields.setdefault("source", None if engine == "sim" else "/srv/models/qwen")
    return ShardSpec(
        shard_id=f"{model}/{replica}/{rank}",
        replica_id=f"{model}/{replica}",
        model=model,
        engine=engine,
        rank=rank,
        **fields,
    )
