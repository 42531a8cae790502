"""vLLM's OpenAI server, on one node or across several.

One node: ``vllm serve MODEL`` with tensor parallelism over the node's GPUs;
when the node knows vLLM as a Python (its own venv, the site's ``python:``),
``PYTHON -m vllm.entrypoints.openai.api_server --model MODEL``, which needs
no ``vllm`` command on any PATH.
Several (``ranks: N``): pipeline parallelism across the nodes, one stage per
node, each stage tensor-parallel over that node's GPUs — the layout vLLM
recommends, because tensor parallelism across a network is slow.  Two
launchers (the profile's ``launcher:``):

- ``native`` (the default): vLLM's own multi-node launcher, the default
  multiprocessing backend.  Every rank runs vLLM with ``--nnodes N
  --node-rank R --master-addr H --master-port P``; rank 0 serves HTTP, the
  others run ``--headless``.  They meet at torch.distributed's store on
  rank 0's master port.
- ``ray``: rank 0 runs the Ray head and vLLM with
  ``--distributed-executor-backend ray``; every other rank runs a Ray
  worker node, ``ray start --address … --block``, and serves no HTTP.
  (vLLM's CPU build refuses the Ray executor; this is for GPU nodes.)
"""

from __future__ import annotations

import hashlib
import math
import os
import shlex
import tempfile
from typing import Sequence

from twisted.logger import Logger

from llmgw.engines.base import (
    CompletionProbe,
    Connected,
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
    launcher_of,
    leader_address,
    option_values,
    RayNodes,
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
# vLLM's own default --master-port (ParallelConfig.master_port).
MASTER_PORT = 29501
#: The rendezvous port each launcher uses when rank 0's leader names none.
DEFAULT_RENDEZVOUS = {"native": MASTER_PORT, "ray": RAY_PORT}
# A headless rank runs what ``vllm serve --headless`` runs.  The vllm command
# itself cannot be used from every build: the CPU wheel's reads the package
# metadata of a "vllm" it is not installed as, and exits.
HEADLESS = (
    "import sys\n"
    "from vllm.entrypoints.serve.utils.api_utils import cli_env_setup\n"
    "cli_env_setup()\n"
    "from vllm.entrypoints.cli.serve import ServeSubcommand\n"
    "from vllm.entrypoints.launchers.cli_args import make_arg_parser\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "ServeSubcommand.cmd(make_arg_parser(FlexibleArgumentParser(prog='vllm serve')).parse_args(sys.argv[1:]))\n"
)
# vllm --version imports torch, which takes tens of seconds on a cold cache.
VERSION_TIMEOUT_S = 60.0

TENSOR_PARALLEL = ("-tp", "--tensor-parallel-size")
PIPELINE_PARALLEL = ("-pp", "--pipeline-parallel-size")
# What llmgw sets for a multi-node replica; on one node a profile may use them.
MULTI_NODE_ARGS = (
    *PIPELINE_PARALLEL, "--distributed-executor-backend",
    "--nnodes", "-n", "--node-rank", "-r", "--master-addr", "--master-port", "--headless",
)  # fmt: skip

# vLLM's FlexibleArgumentParser is argparse (abbreviations and all) that
# first reads "--a_b" as "--a-b" and moves "--key.part V" to the end as "--key".
SPELLING = Spelling(prefixes=True, underscores=True, dotted=True)

_AT_LEAST_ONE = "a whole number, at least 1"
_MEMORY_FRACTION = "a fraction of each GPU's memory, more than 0 and at most 1 (vLLM's default is 0.9)"


class VLLM(EngineAdapter):
    name = "vllm"
    # --tensor-parallel-size is not here: a profile may set it, if it agrees
    # with gpus:.
    # --uds: a Unix socket instead of the host and port llmgw gives it.
    reserved_args = ("--model", "--host", "--port", "--served-model-name", "--uds")
    # vLLM puts a --config file's options before the command line's, so llmgw's win,
    # but the file can set any option llmgw does not write (--uds, --api-key, --ssl-*).
    option_files = ("--config",)
    spelling = SPELLING
    launchers = ("native", "ray")

    def validate(self, args: Sequence[str], *, gpus: int, ranks: int, source: str | None,
                 launcher: str | None = None) -> list[str]:
        problems = super().validate(args, gpus=gpus, ranks=ranks, source=source, launcher=launcher)
        if source is None:
            problems.append("vllm models need a source: the model directory's path on the nodes or a URL")
        pipeline = 1
        if ranks > 1:
            for flag, _ in option_values(args, MULTI_NODE_ARGS, SPELLING):
                problems.append(
                    f"vllm profiles with ranks: {ranks} may not set {flag}: llmgw runs one pipeline "
                    f"stage per node and sets how they meet"
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

    def plan(self, spec: ShardSpec, *, binary: str | None, host: str, port: int, model_path: str | None,
             rendezvous_port: int | None = None) -> LaunchPlan:
        refuse_invalid(self, spec)
        vllm = require_binary(spec, binary, BINARY)
        env = visible_devices(spec.gpus)
        if spec.ranks > 1 and launcher_of(self, spec) == "ray":
            return _ray_plan(spec, vllm, env, host, port, model_path, rendezvous_port, self._serve)
        if spec.ranks > 1 and spec.rank > 0:
            leader, master_port = leader_address(spec.leader, MASTER_PORT, engine="vllm")
            if model_path is None:
                raise ValueError(f"{spec.shard_id}: vllm needs the model's local path")
            head = [vllm, "-c", HEADLESS, "--model"] if is_python(vllm) else [vllm, "serve"]
            argv = [*head, model_path, *_parallel(spec), *_native(spec, leader, master_port), "--headless", *spec.args]
            return LaunchPlan(argv=argv, env=env, health=None, joined=Connected(leader, master_port))
        serve = self._serve(spec, vllm, host, port, model_path)
        if spec.ranks == 1:
            return LaunchPlan(argv=[*serve, *spec.args], env=env, health=HealthProbe("/health"))
        master_port = rendezvous_port or MASTER_PORT
        argv = [*serve, *_native(spec, host, master_port), *spec.args]
        return LaunchPlan(argv=argv, env=env, health=HealthProbe("/health"), rendezvous_port=master_port,
                          joined=CompletionProbe(spec.model))

    def default_rendezvous(self, spec: ShardSpec) -> int | None:
        return DEFAULT_RENDEZVOUS[launcher_of(self, spec)]

    def _serve(self, spec: ShardSpec, vllm: str, host: str, port: int, model_path: str | None) -> list[str]:
        """Rank 0's vLLM server, up to the profile's arguments."""
        if model_path is None:
            raise ValueError(f"{spec.shard_id}: vllm needs the model's local path")
        return [
            *([vllm, "-m", API_SERVER, "--model"] if is_python(vllm) else [vllm, "serve"]), model_path,
            "--host", host,
            "--port", str(port),
            # /v1/models and the "model" field of requests use the catalog's name.
            "--served-model-name", spec.model,
            *_parallel(spec),
        ]  # fmt: skip

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


def _parallel(spec: ShardSpec) -> list[str]:
    """Tensor parallel over this node's GPUs (unless the profile says), and one pipeline stage per rank."""
    argv = []
    if not option_values(spec.args, TENSOR_PARALLEL, SPELLING):
        argv += ["--tensor-parallel-size", str(_tensor_parallel(spec))]
    if spec.ranks > 1:
        argv += ["--pipeline-parallel-size", str(spec.ranks)]
    return argv


def _native(spec: ShardSpec, master: str, master_port: int) -> list[str]:
    """vLLM's own multi-node launcher: this rank's place, and where rank 0's store is."""
    return [
        "--nnodes", str(spec.ranks),
        "--node-rank", str(spec.rank),
        "--master-addr", master,
        "--master-port", str(master_port),
    ]  # fmt: skip


def _ray_plan(spec: ShardSpec, vllm: str, env: dict[str, str], host: str, port: int, model_path: str | None,
              rendezvous_port: int | None, serve) -> LaunchPlan:
    """Ray: the head and vLLM on rank 0, a Ray worker node on every other rank."""
    ray = _ray_beside(vllm)
    if spec.rank > 0:
        leader, ray_port = leader_address(spec.leader, RAY_PORT, engine="vllm")
        # --block keeps the worker in the foreground, so it and the Ray
        # processes it starts live and die with the shard's process group.
        # A worker serves no HTTP: its port is its raylet's, which is how the
        # head's list of nodes names it.
        argv = [ray, "start", "--address", host_port(leader, ray_port), "--node-ip-address", host,
                "--node-manager-port", str(port), *_ray_node(spec, port), "--block"]
        return LaunchPlan(argv=argv, env=env, health=None,
                          joined=RayNodes(ray_nodes_argv(vllm, leader, ray_port), host_port(leader, ray_port), spec.ranks,
                                           node_manager_port=port))
    ray_port = rendezvous_port or RAY_PORT
    serve = [*serve(spec, vllm, host, port, model_path), "--distributed-executor-backend", "ray", *spec.args]
    head = [ray, "start", "--head", f"--node-ip-address={host}", f"--port={ray_port}", *_ray_node(spec, ray_port),
            "--disable-usage-stats", "--block"]
    nodes = ray_nodes_argv(vllm, host, ray_port)
    script = _head_script(ray, head, host_port(host, ray_port), serve, nodes=nodes, ranks=spec.ranks,
                          timeout_s=spec.start_timeout_s)
    return LaunchPlan(argv=["/bin/sh", "-c", script], env=env, health=HealthProbe("/health"), rendezvous_port=ray_port,
                      joined=RayNodes(nodes, host_port(host, ray_port), spec.ranks))


# Prints the alive nodes the head at argv[1] knows, as one JSON line; given a
# count as argv[3], exits 1 while the head sees fewer.
RAY_NODES = (
    "import json, sys\n"
    "from ray._raylet import GcsClient\n"
    "infos = GcsClient(address=sys.argv[1]).get_all_node_info(timeout=float(sys.argv[2])).values()\n"
    "alive = [i for i in infos if i.state == 0]\n"
    "print(json.dumps({'alive': len(alive), 'ports': [i.node_manager_port for i in alive]}))\n"
    "sys.exit(len(sys.argv) > 3 and len(alive) < int(sys.argv[3]))\n"
)
RAY_NODES_TIMEOUT_S = 10


def ray_nodes_argv(python: str, host: str, port: int) -> list[str]:
    """The command that asks the Ray head at *host*:*port* for its alive nodes, with the environment's Python."""
    if not is_python(python):
        python = os.path.join(os.path.dirname(python), "python") if os.path.dirname(python) else "python"
    return [python, "-c", RAY_NODES, host_port(host, port), str(RAY_NODES_TIMEOUT_S)]


def _ray_node(spec: ShardSpec, port: int) -> list[str]:
    """What keeps two Ray nodes apart on one machine: a temp dir of their own, and the head no dashboard.

    Ray's default temp dir (/tmp/ray) holds the sockets of the node started
    last, so a second node on the same machine would take over the first's;
    the dashboard listens on fixed ports.  The directory is under /tmp, not the
    state directory, because Ray's socket paths must stay under 108 bytes.
    """
    digest = hashlib.sha256(f"{spec.shard_id}:{port}".encode()).hexdigest()[:12]
    # Only a head may say whether it has a dashboard.
    dashboard = ["--include-dashboard=false"] if spec.rank == 0 else []
    return ["--temp-dir", os.path.join(tempfile.gettempdir(), f"llmgw-ray-{digest}"), *dashboard]


def _head_script(ray: str, head: list[str], address: str, serve: list[str], *, nodes: list[str], ranks: int,
                 timeout_s: float) -> str:
    """Rank 0 as one shell command: the Ray head, then ``vllm serve`` once all *ranks* nodes joined it.

    vLLM places its pipeline stages on the nodes the head has when it starts,
    so it waits, after ``ray health-check`` answers, until *nodes* (the agent's
    own readiness question, asked with the environment's Python) counts every
    rank alive; that wait ends with the head, or after *timeout_s* (the shard's
    start_timeout_s) saying how many came.  The head runs with --block under
    this shell rather than daemonised, and the shell stops it when vllm ends:
    a head left behind would hold its port and make the next start on this node
    fail.  A signal to the shell reaches both; the shell exits with vllm's
    status, which is the engine's.
    """
    ray_q, address_q = shlex.quote(ray), shlex.quote(address)
    wait_s = max(1, math.ceil(timeout_s))
    return "\n".join([
        f"{shlex.join(head)} &",
        "head=$! serve=",
        "trap 'kill -TERM $head $serve 2>/dev/null' TERM INT HUP",
        f"until {ray_q} health-check --address={address_q} >/dev/null 2>&1; do",
        "  kill -0 $head 2>/dev/null || { echo 'llmgw: the Ray head exited before it was ready' >&2; exit 1; }",
        "  sleep 1",
        "done",
        _say(f"the Ray head at {address} answers; waiting up to {wait_s} s for {ranks} Ray nodes to join it"
            " before starting vllm"),
        f"deadline=$(( $(date +%s) + {wait_s} )) last=",
        f"until seen=$({shlex.join(nodes)} {ranks} 2>/dev/null); do",
        # The answer is one JSON line, {"alive": N, "ports": [...]}.
        "  alive=${seen#*'\"alive\": '} alive=${alive%%,*}",
        "  [ \"$alive\" = \"$last\" ] || " + _say(f"waiting for {ranks} Ray nodes: the head at {address} sees ",
                                                  '"${alive:-none yet}"'),
        "  last=$alive",
        "  kill -0 $head 2>/dev/null || { " + _say("the Ray head exited before its nodes joined") + "; exit 1; }",
        "  if [ $(date +%s) -ge $deadline ]; then",
        "    " + _say(f"{ranks} Ray nodes did not join the head at {address} within {wait_s} s (the shard's"
                     " start_timeout_s); it sees ", '"${alive:-none}"',
                     f"; vllm not started: check that every rank's node reaches {address}"),
        "    kill -TERM $head 2>/dev/null; exit 1",
        "  fi",
        "  sleep 1",
        "done",
        _say(f"all {ranks} Ray nodes joined the head at {address}; starting vllm"),
        # vLLM joins this head, not whichever cluster this machine started last.
        f"RAY_ADDRESS={address_q} {shlex.join(serve)} &",
        "serve=$!",
        "wait $serve; status=$?",
        # A trapped signal ends wait early, while vllm is still shutting down.
        "while kill -0 $serve 2>/dev/null; do wait $serve; status=$?; done",
        "kill -TERM $head 2>/dev/null",
        "exit $status",
    ])  # fmt: skip


def _say(*words: str) -> str:
    """A shell ``echo`` of one llmgw line to stderr: fixed *words* quoted, a ``"$var"`` among them kept."""
    return "echo " + "".join(w if w.startswith('"$') else shlex.quote(w) for w in ("llmgw: " + words[0], *words[1:])) + " >&2"


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

