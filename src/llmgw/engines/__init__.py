"""Engine adapters: how llmgw runs llama.cpp, vLLM, SGLang and its simulator.

``ADAPTERS`` maps each engine name of server.yaml to its adapter;
``adapter_for`` finds one; ``validate_profile`` checks a profile against its
engine before anything is launched.
"""

from __future__ import annotations

from typing import Sequence

from llmgw.engines.base import EngineAdapter, HealthProbe, LaunchPlan, ProbeResult
from llmgw.engines.llamacpp import LlamaCpp
from llmgw.engines.sglang import SGLang
from llmgw.engines.sim import Sim
from llmgw.engines.vllm import VLLM

ADAPTERS: dict[str, EngineAdapter] = {a.name: a for a in (LlamaCpp(), VLLM(), SGLang(), Sim())}


def adapter_for(name: str) -> EngineAdapter:
    try:
        return ADAPTERS[name]
    except KeyError:
        raise ValueError(f"no engine named {name!r}; llmgw knows {', '.join(ADAPTERS)}") from None


def validate_profile(engine: str, args: Sequence[str], gpus: int, ranks: int, source: str | None,
                     launcher: str | None = None) -> list[str]:
    """Every problem with running *args* on *engine*, each a sentence; empty when it can run."""
    try:
        adapter = adapter_for(engine)
    except ValueError as e:
        return [str(e)]
    return adapter.validate(args, gpus=gpus, ranks=ranks, source=source, launcher=launcher)


__all__ = [
    "ADAPTERS",
    "EngineAdapter",
    "HealthProbe",
    "LaunchPlan",
    "ProbeResult",
    "adapter_for",
    "validate_profile",
]
