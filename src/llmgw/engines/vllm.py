"""vLLM's OpenAI server, on one node or across several over Ray.

One node: ``vllm serve MODEL`` with tensor parallelism over the node's GPUs;
when the node knows vLLM as a Python (its own venv, the site's ``python:``),
``PYTHON -m vllm.entrypoints.openai.api_server --model MODEL``, which needs
no ``vllm`` command on any PATH.
Several (``ranks: N``): pipeline parallelism across the nodes, one stage per
node, each stage tensor-parallel over that node's GPUs — the layout vLLM
recommends, because tensor parallelism across a network is slow.  Rank 0 runs
the Ray head and ``vllm serve``; every other rank runs a Ray worker node and
serves no HTTP.
"""

from __future__ import annotations

import os
import shlex
from typing import Sequence

from twisted.logger import Logger

from llmgw.engines.base import (
    EngineAdapter,
    HealthProbe,
    LaunchPlan,
    ProbeFailed,
    ProbeResult,
    Spelling,
    check_executable,
    fraction_option,
    host_port,
    is_python,
    integer_option,
    last_line,
    leader_address,
    option_values,
    probe_python_package,
    refuse_invalid,
    require_binary,
    run_probe,
    version_result,
    visible_devices,
)
from llmgw.records import ShardSpec

log = Logger()

BINARY = "vllm"
# What ``vllm serve`` runs, started from a Python that imports vLLM.
API_SERVER = "vllm.entrypoints.openai.api_server"
# Ray's own default GCS port; a leader written HOST:PORT overrides it.
RAY_PORT = 6379
# vllm --version imports torch, which takes tens of seconds on a cold cache.
VERSION_TIMEOUT_S = 60.0

TENSOR_PARALLEL = ("-tp", "--tensor-parallel-size")
PIPELINE_PARALLEL = ("-pp", "--pipeline-parallel-size")
# What llmgw sets for a multi-node replica; on one node a profile may use them.
MULTI_NODE_ARGS = (*PIPELINE_PARALLEL, "--distributed-executor-backend")

# vLLM's FlexibleArgumentParser is argparse (abbreviations and all) that
# first reads "--a_b" as "--a-b" and moves "--key.part V" to the end as "--key".
SPELLING = Spelling(prefixes=True, underscores=True, dotted=True)

_AT_LEAST_ONE = "a whole number, at least 1"
_MEMORY_FRACTION = "a fraction of each GPU's memory, more than 0 and at most 1 (vLLM's default is 0.9)"


class VLLM(EngineAdapter):
    name = "vllm"
    # --tensor-parallel-size is not here: a profile may set it, if it agrees
    # with gpus:.
    reserved_args = ("--model", "--host", "--port", "--served-model-name")
    spelling = SPELLING

    def validate(self, args: Sequence[str], *, gpus: int, ranks: int, source: str | None) -> list[str]:
        problems = super().validate(args, gpus=gpus, ranks=ranks, source=source)
        if source is None:
            problems.append("vllm models need a source: the model directory's path on the nodes or a URL")
        pipeline = 1
        if ranks > 1:
            for flag, _ in option_values(args, MULTI_NODE_ARGS, SPELLING):
                problems.append(
                    f"vllm profiles with ranks: {ranks} may not set {flag}: llmgw runs one pipeline "
                    f"stage per node over Ray"
                )
        else:
            for flag, value in option_values(args, PIPELINE_PARALLEL, SPELLING):
                number, problem = integer_option(self.name, flag, value, _AT_LEAST_ONE, 1)
                if problem:
                    problems.append(problem)
                pipeline = number or pipeline
        per_node = max(gpus, 1)  # vLLM's CPU backend is one "device"
        if per_node % pipeline:
            problems.append(
                f"vllm --pipeline-parallel-size {pipeline} does not divide gpus: {gpus}; "
                "each pipeline stage needs the same number of GPUs"
            )
            return problems
        expected = per_node // pipeline
        for flag, value in option_values(args, TENSOR_PARALLEL, SPELLING):
            number, problem = integer_option(self.name, flag, value, _AT_LEAST_ONE, 1)
            if problem:
                problems.append(problem)
            if number is not None and number != expected:
                stages = f" / {pipeline} pipeline stages" if pipeline > 1 else ""
                problems.append(
                    f"vllm {flag} {number} does not match gpus: {gpus}{stages}: it must be {expected}; "
                    "leave it out and llmgw sets it"
                )
        for flag, value in option_values(args, ("--gpu-memory-utilization",), SPELLING):
            problem = fraction_option(self.name, flag, value, _MEMORY_FRACTION, one=True)
            if problem:
                problems.append(problem)
        return problems

    def plan(self, spec: ShardSpec, *, binary: str | None, host: str, port: int, model_path: str | None) -> LaunchPlan:
        refuse_invalid(self, spec)
        vllm = require_binary(spec, binary, BINARY)
        env = visible_devices(spec.gpus)
        ray = _ray_beside(vllm)
        if spec.ranks > 1 and spec.rank > 0:
            leader, ray_port = leader_address(spec.leader, RAY_PORT, engine="vllm")
            # --block keeps the worker in the foreground, so it and the Ray
            # processes it starts live and die with the shard's process group.
            argv = [ray, "start", "--address", host_port(leader, ray_port), "--block"]
            return LaunchPlan(argv=argv, env=env, health=None)
        if model_path is None:
            raise ValueError(f"{spec.shard_id}: vllm needs the model's local path")
        serve = [
            *([vllm, "-m", API_SERVER, "--model"] if is_python(vllm) else [vllm, "serve"]), model_path,
            "--host", host,
            "--port", str(port),
            # /v1/models and the "model" field of requests use the catalog's name.
            "--served-model-name", spec.model,
        ]  # fmt: skip
        if not option_values(spec.args, TENSOR_PARALLEL, SPELLING):
            serve += ["--tensor-parallel-size", str(_tensor_parallel(spec))]
        if spec.ranks > 1:
            serve += ["--pipeline-parallel-size", str(spec.ranks), "--distributed-executor-backend", "ray"]
        serve += spec.args
        if spec.ranks == 1:
            return LaunchPlan(argv=serve, env=env, health=HealthProbe("/health"))
        ray_port = leader_address(spec.leader, RAY_PORT, engine="vllm")[1] if spec.leader else RAY_PORT
        return LaunchPlan(argv=["/bin/sh", "-c", _head_script(ray, ray_port, serve)], env=env)

    def probe_detail(self, path: str | None) -> ProbeResult:
        if path and is_python(path):
            return probe_python_package(path, self.name, "vllm", VERSION_TIMEOUT_S)
        try:
            output = run_probe([check_executable(path, BINARY), "--version"], VERSION_TIMEOUT_S)
        except ProbeFailed as e:
            log.warn("vllm unavailable: {reason}", reason=str(e))
            return ProbeResult(None, str(e))
        # Import-time log lines come first; the version is the last line.
        return version_result(self.name, path, last_line(output), f"{path} --version printed no version")


def _head_script(ray: str, ray_port: int, serve: list[str]) -> str:
    """Rank 0 as one shell command: the Ray head, then ``vllm serve`` once it answers.

    The head runs with --block under this shell rather than daemonised, and
    the shell stops it when vllm ends: a head left behind would hold its port
    and make the next start on this node fail.  A signal to the shell reaches
    both; the shell exits with vllm's status, which is the engine's.
    """
    ray_q = shlex.quote(ray)
    return "\n".join([
        f"{ray_q} start --head --port={ray_port} --disable-usage-stats --block &",
        "head=$! serve=",
        "trap 'kill -TERM $head $serve 2>/dev/null' TERM INT HUP",
        f"until {ray_q} health-check --address=127.0.0.1:{ray_port} >/dev/null 2>&1; do",
        "  kill -0 $head 2>/dev/null || { echo 'llmgw: the Ray head exited before it was ready' >&2; exit 1; }",
        "  sleep 1",
        "done",
        f"{shlex.join(serve)} &",
        "serve=$!",
        "wait $serve; status=$?",
        # A trapped signal ends wait early, while vllm is still shutting down.
        "while kill -0 $serve 2>/dev/null; do wait $serve; status=$?; done",
        "kill -TERM $head 2>/dev/null",
        "exit $status",
    ])  # fmt: skip


def _tensor_parallel(spec: ShardSpec) -> int:
    pipeline = 1
    if spec.ranks == 1:
        for _, value in option_values(spec.args, PIPELINE_PARALLEL, SPELLING):
            pipeline = int(value or 1)
    return max(len(spec.gpus), 1) // pipeline


def _ray_beside(vllm: str) -> str:
    """Ray from vLLM's own environment, beside its ``vllm`` or its Python: PATH's may be another version."""
    directory = os.path.dirname(vllm)
    return os.path.join(directory, "ray") if directory else "ray"

