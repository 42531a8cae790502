"""vLLM: argv for one node, for several with vLLM's own launcher or Ray, and what a profile may say.

The argv are checked exactly (tests/integration/test_multinode_vllm.py runs
the native launcher on real vLLM), and Ray's rank 0 shell
command is run against stand-ins for ``ray`` and ``vllm`` that record what
they were asked to do.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shlex
import signal
import subprocess
import sys
import tempfile

import pytest

from llmgw.engines import adapter_for
from llmgw.engines.base import CompletionProbe, Connected, HealthProbe, ProbeResult
from llmgw.engines.vllm import HEADLESS
from llmgw.records import EngineInfo
from tests.support.wait import wait_for

from .helpers import shard

VLLM = adapter_for("vllm")
BIN = "/opt/vllm/bin/vllm"


def plan(spec, binary=BIN, host="10.0.0.5", port=8200, model_path="/cache/qwen", rendezvous_port=None):
    return VLLM.plan(spec, binary=binary, host=host, port=port, model_path=model_path,
                     rendezvous_port=rendezvous_port)


# -- one node -----------------------------------------------------------------


def test_one_node_is_tensor_parallel_over_its_gpus():
    p = plan(shard("vllm", gpus=[4, 5, 6, 7], args=["--max-model-len", "8192"]))
    assert p.argv == [
        BIN, "serve", "/cache/qwen",
        "--host", "10.0.0.5",
        "--port", "8200",
        "--served-model-name", "qwen",
        "--tensor-parallel-size", "4",
        "--max-model-len", "8192",
    ]  # fmt: skip
    assert p.env == {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    assert p.health == HealthProbe("/health")


def test_a_tensor_parallel_size_the_profile_sets_is_not_repeated():
    p = plan(shard("vllm", gpus=[0, 1], args=["-tp", "2"]))
    assert p.argv[-2:] == ["-tp", "2"]
    assert p.argv.count("--tensor-parallel-size") == 0


def test_pipeline_stages_on_one_node_share_its_gpus():
    p = plan(shard("vllm", gpus=[0, 1, 2, 3], args=["--pipeline-parallel-size", "2"]))
    assert p.argv[-4:] == ["--tensor-parallel-size", "2", "--pipeline-parallel-size", "2"]


def test_a_cpu_node_is_one_device_and_sees_no_gpus():
    p = plan(shard("vllm"))
    assert p.argv[-2:] == ["--tensor-parallel-size", "1"]
    assert p.env == {"CUDA_VISIBLE_DEVICES": ""}


def test_a_python_that_imports_vllm_runs_its_api_server():
    # What the node's own venv (pip:) or the site's python: gives: no vllm command on any PATH.
    p = plan(shard("vllm", gpus=[0, 1]), binary="/var/lib/llmgw/engines/vllm/ab12/bin/python3")
    assert p.argv == [
        "/var/lib/llmgw/engines/vllm/ab12/bin/python3", "-m", "vllm.entrypoints.openai.api_server",
        "--model", "/cache/qwen",
        "--host", "10.0.0.5",
        "--port", "8200",
        "--served-model-name", "qwen",
        "--tensor-parallel-size", "2",
    ]  # fmt: skip


def test_rank_0_of_a_python_vllm_takes_ray_from_the_same_environment():
    p = plan(multi(0), binary="/opt/vllm/bin/python")
    assert p.argv[2].startswith("/opt/vllm/bin/ray start --head")
    assert "/opt/vllm/bin/python -m vllm.entrypoints.openai.api_server --model /cache/qwen" in p.argv[2]


def test_without_a_binary_there_is_no_plan():
    with pytest.raises(ValueError, match="qwen/0/0: no vllm to run: the node names no installed build"):
        plan(shard("vllm"), binary=None)


def test_a_plan_needs_the_local_model():
    with pytest.raises(ValueError, match="qwen/0/0: vllm needs the model's local path"):
        plan(shard("vllm", gpus=[0]), model_path=None)


# -- several nodes with vLLM's own launcher (the default) ---------------------


def native(rank, **fields):
    fields.setdefault("leader", None if rank == 0 else "10.0.0.1:29600")
    return shard("vllm", gpus=[0, 1, 2, 3], ranks=2, rank=rank, **fields)


def test_rank_0_serves_and_is_met_at_its_own_master_port():
    p = plan(native(0, args=["--max-model-len", "256"]), binary="/opt/vllm/bin/python", rendezvous_port=29600)
    assert p.argv == [
        "/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/cache/qwen",
        "--host", "10.0.0.5", "--port", "8200", "--served-model-name", "qwen",
        "--tensor-parallel-size", "4", "--pipeline-parallel-size", "2",
        "--nnodes", "2", "--node-rank", "0", "--master-addr", "10.0.0.5", "--master-port", "29600",
        "--max-model-len", "256",
    ]  # fmt: skip
    assert p.health == HealthProbe("/health")
    assert p.rendezvous_port == 29600
    # Health answers before the other ranks joined; a completion needs them all.
    assert p.joined == CompletionProbe("qwen")


def test_without_a_chosen_port_rank_0_uses_vllms_own_master_port():
    p = plan(native(0))
    assert p.argv[p.argv.index("--master-port") + 1] == "29501"
    assert p.rendezvous_port == 29501


def test_other_ranks_run_headless_and_join_rank_0s_master_port():
    p = plan(native(1, args=["--max-model-len", "256"]), binary="/opt/vllm/bin/python")
    assert p.argv[:3] == ["/opt/vllm/bin/python", "-c", HEADLESS]
    assert p.argv[3:] == [
        "--model", "/cache/qwen", "--tensor-parallel-size", "4", "--pipeline-parallel-size", "2",
        "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1", "--master-port", "29600",
        "--headless", "--max-model-len", "256",
    ]  # fmt: skip
    assert p.health is None
    assert p.joined == Connected("10.0.0.1", 29600)
    assert p.rendezvous_port is None


def test_a_vllm_command_runs_headless_as_vllm_serve():
    assert plan(native(1), binary="/usr/bin/vllm").argv[:3] == ["/usr/bin/vllm", "serve", "/cache/qwen"]


def test_a_leader_without_a_port_means_vllms_own_master_port():
    p = plan(native(1, leader="10.0.0.1"))
    assert p.argv[p.argv.index("--master-port") + 1] == "29501"


def test_the_headless_script_is_what_vllm_serve_runs():
    # Compiled here, so a typo fails this test rather than an engine's start.
    compile(HEADLESS, "HEADLESS", "exec")
    assert "ServeSubcommand.cmd(" in HEADLESS


# -- several nodes over Ray ---------------------------------------------------


def multi(rank, **fields):
    fields.setdefault("leader", "10.0.0.1")
    return shard("vllm", gpus=[0, 1, 2, 3], ranks=2, rank=rank, launcher="ray", **fields)


def test_rank_0_starts_the_ray_head_then_serves_one_pipeline_stage_per_node():
    p = plan(multi(0, args=["--max-model-len", "32768"]))
    assert p.argv[:2] == ["/bin/sh", "-c"]
    assert len(p.argv) == 3
    script = p.argv[2].splitlines()
    assert script[0] == ("/opt/vllm/bin/ray start --head --node-ip-address=10.0.0.5 --port=6379 "
                         f"--temp-dir {temp_dir(multi(0), 6379)} --include-dashboard=false --disable-usage-stats --block &")
    assert "until /opt/vllm/bin/ray health-check --address=10.0.0.5:6379 >/dev/null 2>&1; do" in script
    assert (
        # vLLM joins this head, whatever other cluster the machine runs.
        "RAY_ADDRESS=10.0.0.5:6379 /opt/vllm/bin/vllm serve /cache/qwen --host 10.0.0.5 --port 8200 "
        "--served-model-name qwen --tensor-parallel-size 4 --pipeline-parallel-size 2 "
        "--distributed-executor-backend ray --max-model-len 32768 &"
    ) in script
    assert p.env == {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    assert p.health == HealthProbe("/health")
    assert p.rendezvous_port == 6379
    # Ready only once the head counts both nodes, asked with vLLM's own Python.
    assert p.joined.count == 2 and p.joined.head == "10.0.0.5:6379"
    assert p.joined.argv[:2] == ["/opt/vllm/bin/python", "-c"] and p.joined.argv[3] == "10.0.0.5:6379"


def test_workers_join_the_head_and_serve_no_http():
    p = plan(multi(1))
    # A worker serves no HTTP: its port is its raylet's, how the head names it.
    assert p.argv == ["/opt/vllm/bin/ray", "start", "--address", "10.0.0.1:6379", "--node-ip-address", "10.0.0.5",
                      "--node-manager-port", "8200", "--temp-dir", temp_dir(multi(1), 8200), "--block"]
    assert p.env == {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    assert p.health is None
    assert p.joined.node_manager_port == 8200 and p.joined.head == "10.0.0.1:6379"


def temp_dir(spec, port):
    """Where a Ray node of *spec* on *port* keeps its sockets and logs."""
    digest = hashlib.sha256(f"{spec.shard_id}:{port}".encode()).hexdigest()[:12]
    return os.path.join(tempfile.gettempdir(), f"llmgw-ray-{digest}")


def test_each_ray_node_has_a_temp_dir_of_its_own_so_two_share_a_machine():
    dirs = {temp_dir(multi(1), 8200), temp_dir(multi(1), 8201), temp_dir(multi(1, replica=1), 8200)}
    assert len(dirs) == 3 and all(d.startswith(tempfile.gettempdir() + "/llmgw-ray-") for d in dirs)
    # Ray's socket paths must stay under 108 bytes.
    assert all(len(d) < 40 for d in dirs)


def test_the_ray_port_comes_from_the_leader_address_when_it_has_one():
    assert plan(multi(1, leader="[fd00::1]:6380")).argv[3] == "[fd00::1]:6380"
    assert "--port=6380" in plan(multi(0), rendezvous_port=6380).argv[2]


def test_ray_is_taken_from_vllms_environment_or_path():
    assert plan(multi(1), binary="vllm").argv[0] == "ray"


def test_a_worker_without_the_leaders_address_cannot_be_planned():
    with pytest.raises(ValueError, match="a multi-node vllm replica needs rank 0's address"):
        plan(multi(1, leader=None))


def test_model_paths_with_spaces_survive_the_shell():
    p = plan(multi(0), model_path="/cache/my model's dir")
    assert "serve '/cache/my model'\"'\"'s dir' --host" in p.argv[2]


# rank 0's shell command, run for real against stand-ins for ray and vllm

FAKE_RAYLET = """
import os


class _Node:
    state = 0  # alive

    def __init__(self, port):
        self.node_manager_port = port


class GcsClient:
    \"\"\"The head's node table: as many alive nodes as the gate file says (1, the head, without it).\"\"\"

    def __init__(self, address):
        self.address = address

    def get_all_node_info(self, timeout):
        count = int(open(GATE).read()) if os.path.exists(GATE) else 1
        with open(ASKED, "a") as f:
            f.write(f"{self.address} {count}\\n")
        return {i: _Node(8200 + i) for i in range(count)}
"""


@pytest.fixture
def stand_ins(tmp_path, script):
    """Fake ray and vllm beside each other; everything they do goes to ``log``.

    The Python beside them is the real one with a stand-in ``ray._raylet`` on
    its path, so the head's question about its nodes is the agent's own script;
    the node count it answers is the file ``nodes`` (the head alone without it),
    and every time it is asked is a line of ``asked``.
    """
    log = tmp_path / "log"
    fake = tmp_path / "fake" / "ray"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "_raylet.py").write_text(f"GATE = {os.fspath(tmp_path / 'nodes')!r}\n"
                                     f"ASKED = {os.fspath(tmp_path / 'asked')!r}\n{FAKE_RAYLET}")
    script("python", f'PYTHONPATH={shlex.quote(os.fspath(fake.parent))} exec {shlex.quote(sys.executable)} "$@"\n')

    def write(*, ray_start="", vllm="echo \"vllm $*\" >> $LOG; exit 3\n"):
        script("ray", f"""
LOG={log}
case "$1" in
start)
  {ray_start}
  echo "ray $*" >> $LOG
  trap 'echo "ray stopped" >> $LOG; exit 0' TERM
  touch {tmp_path}/ray-ready
  while [ ! -e {tmp_path}/head-exits ]; do sleep 0.05; done
  exit 1 ;;
health-check)
  [ -e {tmp_path}/ray-ready ] ;;
esac
""")
        script("vllm", f"LOG={log}\n{vllm}")
        return os.fspath(tmp_path / "vllm")

    return write, log


def lines(log):
    return log.read_text().splitlines() if log.exists() else []


@contextlib.contextmanager
def running(argv, stderr_path):
    """Rank 0's shell command started in a session of its own, its stderr to *stderr_path*; killed whole after."""
    with open(stderr_path, "w") as stderr:
        engine = subprocess.Popen(argv, stderr=stderr, start_new_session=True)
    try:
        yield engine
    finally:
        try:
            os.killpg(engine.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def asked(tmp_path):
    """How many nodes the head had each time the script asked it."""
    return [line.split()[1] for line in lines(tmp_path / "asked")]


RAY_HEAD_LINE = (f"ray start --head --node-ip-address=10.0.0.5 --port=6379 --temp-dir {temp_dir(multi(0), 6379)} "
                 "--include-dashboard=false --disable-usage-stats --block")
VLLM_SERVE_LINE = ("vllm serve /cache/qwen --host 10.0.0.5 --port 8200 --served-model-name qwen --tensor-parallel-size 4 "
                   "--pipeline-parallel-size 2 --distributed-executor-backend ray")


def test_rank_0_serves_once_the_nodes_joined_and_stops_the_head_when_vllm_ends(stand_ins, tmp_path):
    write, log = stand_ins
    (tmp_path / "nodes").write_text("2")
    p = plan(multi(0), binary=write())
    done = subprocess.run(p.argv, capture_output=True, text=True, timeout=30)
    # The engine's exit status is vllm's.
    assert done.returncode == 3
    wait_for(lambda: "ray stopped" in lines(log), 10, "the stand-in ray to be stopped", detail=lambda: "\n".join(lines(log)))
    assert lines(log) == [RAY_HEAD_LINE, VLLM_SERVE_LINE, "ray stopped"]
    assert lines(tmp_path / "asked") == ["10.0.0.5:6379 2"]


def test_rank_0_starts_vllm_only_once_the_head_counts_every_rank(stand_ins, tmp_path):
    write, log = stand_ins
    p = plan(multi(0), binary=write())
    with running(p.argv, tmp_path / "stderr") as engine:
        # Asked twice and seen only the head: the script is waiting, not serving.
        wait_for(lambda: asked(tmp_path)[1:], 20, "the head to be asked for its nodes twice",
                 detail=lambda: "\n".join(lines(log)))
        assert lines(log) == [RAY_HEAD_LINE]
        (tmp_path / "nodes").write_text("2")
        assert engine.wait(timeout=20) == 3
        wait_for(lambda: "ray stopped" in lines(log), 10, "the stand-in ray to be stopped",
                 detail=lambda: "\n".join(lines(log)))
    assert lines(log) == [RAY_HEAD_LINE, VLLM_SERVE_LINE, "ray stopped"]
    assert set(asked(tmp_path)[:-1]) == {"1"} and asked(tmp_path)[-1] == "2"
    assert lines(tmp_path / "stderr") == [
        "llmgw: the Ray head at 10.0.0.5:6379 answers; waiting up to 600 s for 2 Ray nodes to join it before starting vllm",
        "llmgw: waiting for 2 Ray nodes: the head at 10.0.0.5:6379 sees 1",
        "llmgw: all 2 Ray nodes joined the head at 10.0.0.5:6379; starting vllm",
    ]


def test_rank_0_gives_up_on_nodes_that_never_join_within_the_start_timeout(stand_ins, tmp_path):
    write, log = stand_ins
    p = plan(multi(0, start_timeout_s=1.5), binary=write())
    done = subprocess.run(p.argv, capture_output=True, text=True, timeout=30)
    assert done.returncode == 1
    assert ("llmgw: 2 Ray nodes did not join the head at 10.0.0.5:6379 within 2 s (the shard's start_timeout_s); "
            "it sees 1; vllm not started: check that every rank's node reaches 10.0.0.5:6379") in done.stderr
    wait_for(lambda: "ray stopped" in lines(log), 10, "the stand-in ray to be stopped", detail=lambda: "\n".join(lines(log)))
    assert lines(log) == [RAY_HEAD_LINE, "ray stopped"]


def test_rank_0_fails_saying_so_when_the_head_exits_while_its_nodes_join(stand_ins, tmp_path):
    write, log = stand_ins
    p = plan(multi(0), binary=write())
    with running(p.argv, tmp_path / "stderr") as engine:
        wait_for(lambda: asked(tmp_path), 20, "the head to be asked for its nodes", detail=lambda: "\n".join(lines(log)))
        (tmp_path / "head-exits").touch()
        assert engine.wait(timeout=20) == 1
    assert "llmgw: the Ray head exited before its nodes joined" in (tmp_path / "stderr").read_text()
    assert lines(log) == [RAY_HEAD_LINE]


def test_rank_0_fails_saying_so_when_the_head_does_not_start(stand_ins):
    write, log = stand_ins
    p = plan(multi(0), binary=write(ray_start='echo "ray: port 6379 already in use" >&2; exit 1'))
    done = subprocess.run(p.argv, capture_output=True, text=True, timeout=30)
    assert done.returncode == 1
    assert "llmgw: the Ray head exited before it was ready" in done.stderr
    assert not any(line.startswith("vllm") for line in lines(log))


def test_stopping_rank_0_stops_vllm_and_the_head(stand_ins, tmp_path):
    write, log = stand_ins
    vllm = write(vllm="""trap 'echo "vllm stopped" >> $LOG; exit 0' TERM
echo "vllm $*" >> $LOG
while :; do sleep 0.05; done
""")
    (tmp_path / "nodes").write_text("2")
    p = plan(multi(0), binary=vllm)
    with running(p.argv, tmp_path / "stderr") as engine:
        wait_for(lambda: any(line.startswith("vllm serve") for line in lines(log)), 10, "vllm serve to start",
                 detail=lambda: "\n".join(lines(log)))
        # Only the shell is signalled: it must pass the stop on.
        engine.send_signal(signal.SIGTERM)
        assert engine.wait(timeout=10) == 0
        wait_for(lambda: "ray stopped" in lines(log), 10, "the stand-in ray to be stopped", detail=lambda: "\n".join(lines(log)))
        assert "vllm stopped" in lines(log)


# -- validation ---------------------------------------------------------------


@pytest.mark.parametrize(
    "args, gpus, ranks, problems",
    [
        (["--tensor-parallel-size", "4", "--gpu-memory-utilization", "1"], 4, 1, []),
        (["-tp=2", "-pp", "2"], 4, 1, []),
        (["-tp", "8"], 8, 2, []),
        (["--tensor-parallel-size", "4"], 2, 1, [
            "vllm --tensor-parallel-size 4 does not match gpus: 2: it must be 2; leave it out and llmgw sets it",
        ]),
        (["-tp", "16"], 8, 2, ["vllm -tp 16 does not match gpus: 8: it must be 8; leave it out and llmgw sets it"]),
        (["-tp", "4", "-pp", "2"], 4, 1, [
            "vllm -tp 4 does not match gpus: 4 / 2 pipeline stages: it must be 2; leave it out and llmgw sets it",
        ]),
        (["--pipeline-parallel-size", "3"], 4, 1, [
            "vllm --pipeline-parallel-size 3 does not divide gpus: 4; "
            "each pipeline stage needs the same number of GPUs",
        ]),
        (["-tp", "two"], 2, 1, ["vllm -tp must be a whole number, at least 1, not 'two'"]),
        (["-tp", "0"], 0, 1, ["vllm -tp must be a whole number, at least 1, not 0"]),
        (["--tensor-parallel-size"], 2, 1, ["vllm --tensor-parallel-size needs a value: a whole number, at least 1"]),
        (["--pipeline-parallel-size", "2"], 4, 2, [
            "vllm profiles with ranks: 2 may not set --pipeline-parallel-size: llmgw runs one pipeline stage "
            "per node and sets how they meet",
        ]),
        (["--distributed-executor-backend", "mp"], 4, 2, [
            "vllm profiles with ranks: 2 may not set --distributed-executor-backend: llmgw runs one pipeline "
            "stage per node and sets how they meet",
        ]),
        (["--master-port=1234", "--headless"], 4, 2, [
            "vllm profiles with ranks: 2 may not set --master-port: llmgw runs one pipeline stage "
            "per node and sets how they meet",
            "vllm profiles with ranks: 2 may not set --headless: llmgw runs one pipeline stage "
            "per node and sets how they meet",
        ]),
        (["--gpu-memory-utilization", "0"], 1, 1, [
            "vllm --gpu-memory-utilization must be a fraction of each GPU's memory, more than 0 and at most 1 "
            "(vLLM's default is 0.9), not 0",
        ]),
        (["--gpu-memory-utilization=1.2"], 1, 1, [
            "vllm --gpu-memory-utilization must be a fraction of each GPU's memory, more than 0 and at most 1 "
            "(vLLM's default is 0.9), not 1.2",
        ]),
        (["--gpu-memory-utilization", "90%"], 1, 1, [
            "vllm --gpu-memory-utilization must be a fraction of each GPU's memory, more than 0 and at most 1 "
            "(vLLM's default is 0.9), not '90%'",
        ]),
    ],
)
def test_validation(args, gpus, ranks, problems):
    assert VLLM.validate(args, gpus=gpus, ranks=ranks, source="/m") == problems


def test_vllm_has_both_launchers_and_no_other():
    assert VLLM.validate([], gpus=1, ranks=2, source="/m", launcher="native") == []
    assert VLLM.validate([], gpus=1, ranks=2, source="/m", launcher="ray") == []
    assert VLLM.validate([], gpus=1, ranks=2, source="/m", launcher="slurm") == [
        "vllm has no launcher 'slurm': its ranks meet only with launcher: native or ray"]


def test_a_vllm_model_needs_a_source():
    assert VLLM.validate([], gpus=1, ranks=1, source=None) == [
        "vllm models need a source: the model directory's path on the nodes or a URL"
    ]


# -- probing ------------------------------------------------------------------


def test_probe_takes_the_version_from_the_last_line(script):
    path = script("vllm", 'echo "INFO 09-28 12:00:00 [__init__.py:241] Automatically detected platform cuda."\n'
                          'echo "0.10.1.1"\n')
    assert VLLM.probe_detail(path).info == EngineInfo("vllm", "0.10.1.1", path)


def test_a_vllm_that_cannot_start_is_not_an_engine(script):
    path = script("vllm", 'echo "ImportError: libcudart.so.12: cannot open shared object file" >&2\nexit 1\n')
    result = VLLM.probe_detail(path)
    assert result.info is None
    assert result.reason == (
        f"{path} --version exited with status 1: ImportError: libcudart.so.12: cannot open shared object file"
    )


def test_a_python_is_asked_for_the_version_vllm_imports_as(script):
    python = script("python3", 'test "$1" = -c || exit 2\necho "$2" > "$0.asked"\necho "0.11.0"\n')
    assert VLLM.probe_detail(python).info == EngineInfo("vllm", "0.11.0", python)
    assert open(python + ".asked").read().strip() == "import vllm; print(vllm.__version__)"


def test_a_python_without_vllm_is_said_so(script):
    python = script("python3.12", 'echo "ModuleNotFoundError: No module named \'vllm\'" >&2\nexit 1\n')
    assert VLLM.probe_detail(python) == ProbeResult(
        None, f"{python} cannot import vllm; name the Python of vllm's environment"
    )


def test_path_is_never_searched(script, tmp_path, monkeypatch):
    script("vllm", 'echo "0.10.1.1"\n')
    monkeypatch.setenv("PATH", os.fspath(tmp_path))
    assert VLLM.probe(None) is None
    assert VLLM.probe_detail(None).reason == "no vllm path given to probe"


#: Ray's default worker ports (``ray start --min-worker-port/--max-worker-port``),
#: read in the Ray this project installs: ray/scripts/scripts.py, ``ray start``'s defaults.
RAY_WORKER_PORTS = range(10002, 20000)


def test_the_default_engine_ports_are_none_of_rays_worker_ports():
    """A Ray worker rank is started with its engine port as --node-manager-port; Ray refuses one among its
    worker ports ("ValueError: Ray component worker_ports is trying to use a port number 15443 that is used by
    other components"), which the first default, 12000-19999, made every multi-node Ray replica do."""
    from llmgw.config.agent import DEFAULT_ENGINE_PORTS
    first, last = (int(p) for p in DEFAULT_ENGINE_PORTS.split("-"))
    assert not set(range(first, last + 1)) & set(RAY_WORKER_PORTS)
