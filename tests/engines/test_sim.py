"""sim: llmgw's simulator runs from the agent's own Python, anywhere, without weights."""

from __future__ import annotations

import sys

import pytest

import llmgw
from llmgw.engines import adapter_for
from llmgw.engines.base import HealthProbe
from llmgw.records import EngineInfo

from .helpers import shard

SIM = adapter_for("sim")


def test_plan():
    # Built without importing llmgw.sim: the plan is only an argv.
    p = SIM.plan(shard("sim", model="echo", args=["--ttft-ms", "0"]),
                 binary=None, host="127.0.0.1", port=8400, model_path=None)
    assert p.argv == [
        sys.executable, "-m", "llmgw.sim",
        "--host", "127.0.0.1",
        "--port", "8400",
        "--model", "echo",
        "--ttft-ms", "0",
    ]  # fmt: skip
    assert p.env == {"CUDA_VISIBLE_DEVICES": ""}
    assert p.health == HealthProbe("/health")


def test_a_sim_profile_that_asks_for_gpus_is_given_them_like_any_engine():
    p = SIM.plan(shard("sim", gpus=[1]), binary="/usr/bin/python3", host="h", port=1, model_path=None)
    assert p.argv[0] == "/usr/bin/python3"
    assert p.env == {"CUDA_VISIBLE_DEVICES": "1"}


@pytest.mark.parametrize(
    "args, ranks, problems",
    [
        (["--ttft-ms", "50", "--tokens-per-s", "30"], 1, []),
        ([], 2, ["sim runs on one node, ranks: 2 cannot be; set ranks: 1"]),
        (["--model=x"], 1, ["sim profiles may not set --model: llmgw sets it for each shard"]),
    ],
)
def test_validation(args, ranks, problems):
    # No source: sim needs no weights.
    assert SIM.validate(args, gpus=0, ranks=ranks, source=None) == problems


def test_sim_is_always_available():
    assert SIM.probe(None) == EngineInfo("sim", llmgw.__version__, sys.executable)
    assert SIM.probe_detail(None).reason is None
