"""SGLang's server, on one node or across several with torch.distributed.

SGLang is a Python package, not a program: the "binary" is the Python that
can import it — the node's own venv, the site's ``python:`` or agent.yaml's
path, never the agent's own interpreter.  Across nodes every rank runs the
same command with its own ``--node-rank``; ranks meet at ``--dist-init-addr``
on rank 0, and only rank 0 serves HTTP.  Unlike vLLM's, SGLang's tensor parallelism counts the GPUs of
every node together.
"""

from __future__ import annotations

from typing import Sequence

from llmgw.engines.base import (
    CompletionProbe,
    Connected,
    EngineAdapter,
    HealthProbe,
    LaunchPlan,
    ProbeResult,
    Spelling,
    fraction_option,
    host_port,
    integer_option,
    leader_address,
    option_values,
    probe_python_package,
    refuse_invalid,
    require_binary,
    visible_devices,
)
from llmgw.records import ShardSpec

# The port of SGLang's own multi-node examples; a leader written HOST:PORT
# overrides it.
DIST_INIT_PORT = 20000
# Importing sglang imports torch: tens of seconds on a cold cache.
VERSION_TIMEOUT_S = 60.0

# --tp works only as argparse's abbreviation of --tp-size, so llmgw writes
# --tp-size; a profile may use any of the three.
TENSOR_PARALLEL = ("--tp-size", "--tensor-parallel-size", "--tp")
PIPELINE_PARALLEL = ("--pp-size", "--pipeline-parallel-size")

# argparse with its abbreviations.  Some releases also read "--a_b" as
# "--a-b"; refusing that spelling where argparse would not know it costs nothing.
SPELLING = Spelling(prefixes=True, underscores=True)

_AT_LEAST_ONE = "a whole number, at least 1"
# 1 would leave nothing for activations: the engine dies at its first batch.
_MEMORY_FRACTION = "a fraction of each GPU's memory, more than 0 and less than 1"


class SGLang(EngineAdapter):
    name = "sglang"
    reserved_args = (
        "--model-path", "--model",
        "--host", "--port",
        "--served-model-name",
        "--nnodes", "--node-rank", "--dist-init-addr",
    )  # fmt: skip
    # As vLLM's: a --config YAML's options go under the command line's (ConfigArgumentMerger).
    option_files = ("--config",)
    spelling = SPELLING
    launchers = ("native",)

    def validate(self, args: Sequence[str], *, gpus: int, ranks: int, source: str | None,
                 launcher: str | None = None) -> list[str]:
        problems = super().validate(args, gpus=gpus, ranks=ranks, source=source, launcher=launcher)
        if source is None:
            problems.append("sglang models need a source: the model directory's path on the nodes or a URL")
        total = max(gpus, 1) * ranks
        pipeline, pipeline_flag = 1, PIPELINE_PARALLEL[0]
        for flag, value in option_values(args, PIPELINE_PARALLEL, SPELLING):
            number, problem = integer_option(self.name, flag, value, _AT_LEAST_ONE, 1)
            if problem:
                problems.append(problem)
            pipeline, pipeline_flag = number or pipeline, flag
        if total % pipeline:
            problems.append(
                f"sglang {pipeline_flag} {pipeline} does not divide the {total} GPUs "
                f"of gpus: {gpus} × ranks: {ranks}"
            )
            return problems
        expected = total // pipeline
        for flag, value in option_values(args, TENSOR_PARALLEL, SPELLING):
            number, problem = integer_option(self.name, flag, value, _AT_LEAST_ONE, 1)
            if problem:
                problems.append(problem)
            if number is not None and number != expected:
                problems.append(
                    f"sglang {flag} {number} does not match gpus: {gpus} × ranks: {ranks}"
                    + (f" / {pipeline} pipeline stages" if pipeline > 1 else "")
                    + f": it must be {expected}; leave it out and llmgw sets it"
                )
        for flag, value in option_values(args, ("--mem-fraction-static",), SPELLING):
            problem = fraction_option(self.name, flag, value, _MEMORY_FRACTION, one=False)
            if problem:
                problems.append(problem)
        return problems

    def default_rendezvous(self, spec: ShardSpec) -> int | None:
        return DIST_INIT_PORT

    def plan(self, spec: ShardSpec, *, binary: str | None, host: str, port: int, model_path: str | None,
             rendezvous_port: int | None = None) -> LaunchPlan:
        refuse_invalid(self, spec)
        if model_path is None:
            raise ValueError(f"{spec.shard_id}: sglang needs the model's local path")
        argv = [
            require_binary(spec, binary, "sglang"), "-m", "sglang.launch_server",
            "--model-path", model_path,
            "--host", host,
            "--port", str(port),
            # /v1/models and the "model" field of requests use the catalog's name.
            "--served-model-name", spec.model,
        ]  # fmt: skip
        if not option_values(spec.args, TENSOR_PARALLEL, SPELLING):
            argv += ["--tp-size", str(_tensor_parallel(spec))]
        env = visible_devices(spec.gpus)
        if spec.ranks == 1:
            return LaunchPlan(argv=[*argv, *spec.args], env=env, health=HealthProbe("/health"))
        if spec.rank == 0:
            # Rank 0 is met at its own address, on the port its node chose.
            leader, dist_port = host, rendezvous_port or DIST_INIT_PORT
        else:
            leader, dist_port = leader_address(spec.leader, DIST_INIT_PORT, engine="sglang")
        argv += [
            "--nnodes", str(spec.ranks),
            "--node-rank", str(spec.rank),
            "--dist-init-addr", host_port(leader, dist_port),
            *spec.args,
        ]  # fmt: skip
        if spec.rank == 0:
            return LaunchPlan(argv=argv, env=env, health=HealthProbe("/health"), rendezvous_port=dist_port,
                              joined=CompletionProbe(spec.model))
        # Ranks other than 0 run their share of the model and no HTTP server.
        return LaunchPlan(argv=argv, env=env, health=None, joined=Connected(leader, dist_port))

    def probe_detail(self, path: str | None) -> ProbeResult:
        return probe_python_package(path, self.name, "sglang", VERSION_TIMEOUT_S)


def _tensor_parallel(spec: ShardSpec) -> int:
    pipeline = 1
    for _, value in option_values(spec.args, PIPELINE_PARALLEL, SPELLING):
        pipeline = int(value or 1)
    return max(len(spec.gpus), 1) * spec.ranks // pipeline


