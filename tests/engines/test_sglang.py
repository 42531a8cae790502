"""SGLang: argv on one node and across several, what a profile may say, and finding its Python."""

from __future__ import annotations

import os

import pytest

from llmgw.engines import adapter_for
from llmgw.engines.base import CompletionProbe, Connected, HealthProbe
from llmgw.records import EngineInfo

from .helpers import shard

SGLANG = adapter_for("sglang")
PY = "/opt/sglang/bin/python"


def plan(spec, binary=PY, host="10.0.0.5", port=8300, model_path="/cache/qwen"):
    return SGLANG.plan(spec, binary=binary, host=host, port=port, model_path=model_path)


def test_one_node():
    p = plan(shard("sglang", gpus=[0, 1], args=["--context-length", "8192"]))
    assert p.argv == [
        PY, "-m", "sglang.launch_server",
        "--model-path", "/cache/qwen",
        "--host", "10.0.0.5",
        "--port", "8300",
        "--served-model-name", "qwen",
        "--tp-size", "2",
        "--context-length", "8192",
    ]  # fmt: skip
    assert p.env == {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert p.health == HealthProbe("/health")


def test_without_a_python_there_is_no_plan_rather_than_the_agents_own():
    with pytest.raises(ValueError, match="qwen/0/0: no sglang to run: the node names no installed build"):
        plan(shard("sglang", gpus=[0]), binary=None)


def test_a_tensor_parallel_size_the_profile_sets_is_not_repeated():
    p = plan(shard("sglang", gpus=[0, 1], args=["--tp", "2"]))
    assert "--tp-size" not in p.argv
    assert p.argv[-2:] == ["--tp", "2"]


def test_pipeline_stages_divide_the_tensor_parallel_size():
    p = plan(shard("sglang", gpus=[0, 1, 2, 3], args=["--pp-size", "2"]))
    assert p.argv[-4:] == ["--tp-size", "2", "--pp-size", "2"]


@pytest.mark.parametrize("rank, address", [(0, "10.0.0.5:29000"), (1, "10.0.0.1:29000")])
def test_every_rank_runs_the_same_command_with_its_own_rank(rank, address):
    spec = shard("sglang", gpus=[0, 1, 2, 3, 4, 5, 6, 7], ranks=2, rank=rank,
                 leader=None if rank == 0 else "10.0.0.1:29000")
    p = SGLANG.plan(spec, binary=PY, host="10.0.0.5", port=8300, model_path="/cache/qwen",
                    rendezvous_port=29000 if rank == 0 else None)
    assert p.argv == [
        PY, "-m", "sglang.launch_server",
        "--model-path", "/cache/qwen",
        "--host", "10.0.0.5",
        "--port", "8300",
        "--served-model-name", "qwen",
        # SGLang counts the GPUs of every node together.
        "--tp-size", "16",
        "--nnodes", "2",
        "--node-rank", str(rank),
        # Rank 0 is met at its own address, on the port its node chose.
        "--dist-init-addr", address,
    ]  # fmt: skip
    if rank == 0:
        # Only rank 0 serves HTTP, and is ready once a completion runs through every rank.
        assert (p.health, p.rendezvous_port, p.joined) == (HealthProbe("/health"), 29000, CompletionProbe("qwen"))
    else:
        assert (p.health, p.rendezvous_port, p.joined) == (None, None, Connected("10.0.0.1", 29000))


def test_sglang_has_its_own_launcher_only():
    assert SGLANG.validate([], gpus=1, ranks=2, source="/m", launcher="native") == []
    assert SGLANG.validate([], gpus=1, ranks=2, source="/m", launcher="ray") == [
        "sglang has no launcher 'ray': its ranks meet only with launcher: native"]


@pytest.mark.parametrize(
    "leader, address",
    [("node01:5000", "node01:5000"), ("fd00::1", "[fd00::1]:20000"), ("[fd00::1]:5000", "[fd00::1]:5000")],
)
def test_the_rendezvous_address(leader, address):
    p = plan(shard("sglang", gpus=[0], ranks=2, rank=1, leader=leader))
    assert p.argv[p.argv.index("--dist-init-addr") + 1] == address


def test_other_ranks_need_the_leaders_address():
    with pytest.raises(ValueError, match="a multi-node sglang replica needs rank 0's address"):
        plan(shard("sglang", gpus=[0], ranks=2, rank=1))


@pytest.mark.parametrize(
    "args, gpus, ranks, problems",
    [
        (["--tp-size", "16", "--mem-fraction-static", "0.85"], 8, 2, []),
        (["--tensor-parallel-size", "2", "--pp-size", "2"], 4, 1, []),
        (["--tp", "8"], 8, 2, [
            "sglang --tp 8 does not match gpus: 8 × ranks: 2: it must be 16; leave it out and llmgw sets it",
        ]),
        (["--tp-size", "4", "--pipeline-parallel-size", "2"], 4, 1, [
            "sglang --tp-size 4 does not match gpus: 4 × ranks: 1 / 2 pipeline stages: it must be 2; "
            "leave it out and llmgw sets it",
        ]),
        (["--pp-size", "3"], 4, 1, ["sglang --pp-size 3 does not divide the 4 GPUs of gpus: 4 × ranks: 1"]),
        (["--tp-size", "x"], 1, 1, ["sglang --tp-size must be a whole number, at least 1, not 'x'"]),
        (["--mem-fraction-static", "1"], 1, 1, [
            "sglang --mem-fraction-static must be a fraction of each GPU's memory, more than 0 and less than 1, not 1",
        ]),
        (["--mem-fraction-static"], 1, 1, [
            "sglang --mem-fraction-static needs a value: a fraction of each GPU's memory, more than 0 and less than 1",
        ]),
    ],
)
def test_validation(args, gpus, ranks, problems):
    assert SGLANG.validate(args, gpus=gpus, ranks=ranks, source="/m") == problems


def test_an_sglang_model_needs_a_source():
    assert SGLANG.validate([], gpus=1, ranks=1, source=None) == [
        "sglang models need a source: the model directory's path on the nodes or a URL"
    ]


# -- probing: the "binary" is a Python that can import sglang ------------------


def test_probe_asks_the_configured_python_for_sglangs_version(script):
    python = script("python", 'test "$1" = -c || exit 2\necho "0.5.2"\n')
    assert SGLANG.probe(python) == EngineInfo("sglang", "0.5.2", python)


def test_a_python_without_sglang_is_said_so(script):
    python = script("python", """
echo "Traceback (most recent call last):" >&2
echo "ModuleNotFoundError: No module named 'sglang'" >&2
exit 1
""")
    result = SGLANG.probe_detail(python)
    assert result.info is None
    assert result.reason == f"{python} cannot import sglang; name the Python of sglang's environment"


def test_the_agents_own_python_is_never_asked():
    assert SGLANG.probe_detail(None).reason == "no sglang path given to probe"


def test_a_configured_python_that_is_not_there(tmp_path):
    missing = os.fspath(tmp_path / "venv" / "bin" / "python")
    assert SGLANG.probe_detail(missing).reason == f"{missing} does not exist"
