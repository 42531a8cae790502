"""llmgw's own engine simulator, ``python -m llmgw.sim``: no weights, no GPUs.

It ships with llmgw, so it is on every node that runs an agent and needs no
install; its flags (time to first token, tokens per second, ...) are the
profile's args.
"""

from __future__ import annotations

import sys
from typing import Sequence

import llmgw
from llmgw.engines.base import (
    EngineAdapter,
    HealthProbe,
    LaunchPlan,
    ProbeResult,
    Spelling,
    refuse_invalid,
    visible_devices,
)
from llmgw.records import EngineInfo, ShardSpec

MODULE = "llmgw.sim"


class Sim(EngineAdapter):
    name = "sim"
    reserved_args = ("--host", "--port", "--model")
    # llmgw.sim.options reads every option by its whole name only.
    spelling = Spelling()

    def validate(self, args: Sequence[str], *, gpus: int, ranks: int, source: str | None,
                 launcher: str | None = None) -> list[str]:
        problems = super().validate(args, gpus=gpus, ranks=ranks, source=source, launcher=launcher)
        if ranks != 1:
            problems.append(f"sim runs on one node, ranks: {ranks} cannot be; set ranks: 1")
        return problems

    def plan(self, spec: ShardSpec, *, binary: str | None, host: str, port: int, model_path: str | None) -> LaunchPlan:
        refuse_invalid(self, spec)
        argv = [
            binary or sys.executable, "-m", MODULE,
            "--host", host,
            "--port", str(port),
            "--model", spec.model,
            *spec.args,
        ]  # fmt: skip
        # The simulator uses no GPU; the variable keeps a sim profile that asks
        # for cards (to rehearse placement) as contained as a real engine.
        return LaunchPlan(argv=argv, env=visible_devices(spec.gpus), health=HealthProbe("/health"))

    def probe_detail(self, path: str | None = None) -> ProbeResult:
        # The agent's own Python runs it, and that Python is running now.
        return ProbeResult(EngineInfo(self.name, llmgw.__version__, sys.executable))
