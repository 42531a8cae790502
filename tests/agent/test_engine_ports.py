"""Engine ports: drawn from agent.yaml's engine_ports, and an engine that finds its port taken is started again on another.

The race is made on purpose: the planner, which runs after the supervisor
chose the port and before the engine binds it, lets a real listening socket
take that port, as another process on the node could.  The engine is the
real simulator, which exits saying it cannot listen there.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import urllib.request
from pathlib import Path

import attrs
import psutil
import pytest
import pytest_twisted
from twisted.internet import reactor, threads
from twisted.internet.task import Clock

from llmgw.agent import ports
from llmgw.agent.procs import MARK_STATE_DIR
from llmgw.agent.service import Agent
from llmgw.agent.supervisor import Supervisor
from llmgw.config import load_agent_config
from llmgw.engines.sim import Sim
from llmgw.huburl import HubAddress
from llmgw.records import ShardSpec
from tests.support.net import free_port
from tests.support.wait import until

from .installs import StandInInstaller

SRC = str(Path(__file__).resolve().parents[2] / "src")
HOST = "127.0.0.1"


def spec(shard_id: str = "sim-test/0/0", **kw) -> ShardSpec:
    return ShardSpec(shard_id=shard_id, replica_id=shard_id.rsplit("/", 1)[0], model="sim-test", engine="sim",
                     start_timeout_s=20.0, **kw)


class TakesPorts:
    """A planner that lets a listening socket take the first *times* ports it is given, then plans the sim."""

    def __init__(self, times: int):
        self.times = times
        self.given: list[int] = []
        self.held: list[socket.socket] = []

    def __call__(self, shard: ShardSpec, port: int):
        self.given.append(port)
        if len(self.held) < self.times:
            self.held.append(socket.create_server((HOST, port)))
        plan = Sim().plan(shard, binary=None, host=HOST, port=port, model_path=None)
        return attrs.evolve(plan, env={**plan.env, "PYTHONPATH": SRC})

    def close(self) -> None:
        for s in self.held:
            s.close()


@pytest_twisted.async_yield_fixture
async def node(tmp_path):
    made: list[tuple[Supervisor, TakesPorts]] = []
    state = (tmp_path / "state").resolve()

    def supervisor(planner: TakesPorts, **kw) -> tuple[Supervisor, list]:
        reports: list = []
        sup = Supervisor(reactor, state, planner, reports.append, host=HOST, poll_interval=0.05,
                         health_interval=0.05, stop_grace_s=2, probe_timeout_s=1.0, **kw)
        made.append((sup, planner))
        return sup, reports

    yield supervisor
    for sup, planner in made:
        sup.close()
        planner.close()
    engines = [p for p in psutil.process_iter() if _marked(p, state)]
    for proc in engines:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
    await until(lambda: not any(_marked(p, state) for p in psutil.process_iter()), "every engine the test started gone")


def _marked(proc: psutil.Process, state: Path) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE and proc.environ().get(MARK_STATE_DIR) == str(state)
    except psutil.Error:
        return False


def reached(reports: list, state: str):
    return lambda: next((r for r in reports if r.state == state), None)


async def health(endpoint: str) -> int:
    def get():
        with urllib.request.urlopen(endpoint + "/health", timeout=5) as r:
            return r.status

    return await threads.deferToThread(get)


@pytest_twisted.ensureDeferred
async def test_an_engine_whose_port_another_process_took_comes_up_on_another(node, tmp_path):
    planner = TakesPorts(times=1)
    sup, reports = node(planner)
    sup.start(spec())
    ready = await until(reached(reports, "ready"), "the shard ready", detail=lambda: str(reports))

    taken, second = planner.given
    assert ready.endpoint == f"http://{HOST}:{second}" != f"http://{HOST}:{taken}"
    assert await health(ready.endpoint) == 200
    assert [r.state for r in reports] == ["starting", "starting", "ready"]
    assert [r.endpoint for r in reports[:2]] == [f"http://{HOST}:{taken}", ready.endpoint]
    log = (tmp_path / "state" / "shards").glob("*.log")
    text = "\n".join(p.read_text() for p in log)
    assert f"sim: cannot listen on {HOST}:{taken}" in text
    assert f"port {taken} is held by another process; starting it again on another (launch 2 of 3)" in text


@pytest_twisted.ensureDeferred
async def test_an_engine_that_finds_its_port_taken_every_time_fails_after_the_last_try(node):
    planner = TakesPorts(times=2)
    sup, reports = node(planner, port_tries=2)
    sup.start(spec())
    failed = await until(reached(reports, "failed"), "the shard failed", detail=lambda: str(reports))
    assert len(planner.given) == 2
    assert failed.reason == "exited with code 1"
    assert any(f"sim: cannot listen on {HOST}:{planner.given[1]}" in line for line in failed.output_tail)


@pytest_twisted.ensureDeferred
async def test_a_port_the_spec_names_is_not_moved_when_taken(node):
    port = free_port()
    planner = TakesPorts(times=1)
    sup, reports = node(planner)
    sup.start(spec(port=port))
    failed = await until(reached(reports, "failed"), "the shard failed", detail=lambda: str(reports))
    assert planner.given == [port]
    assert failed.reason == "exited with code 1"


class Scripted(random.Random):
    def __init__(self, *draws: int):
        super().__init__()
        self.draws = list(draws)

    def choice(self, seq):
        return self.draws.pop(0)


def test_a_port_found_bound_or_held_by_the_nodes_engines_is_passed_over():
    held, free = free_port(), free_port()
    with socket.create_server((HOST, 0)) as listener:
        bound = listener.getsockname()[1]
        assert ports.unbound_port(HOST, range(1024, 65536), {held}, draw=Scripted(bound, held, free)) == free


def test_a_range_with_no_port_left_says_which_and_what_to_do():
    with socket.create_server((HOST, 0)) as listener:
        bound = listener.getsockname()[1]
        with pytest.raises(OSError, match=f"no free port in engine_ports {bound}-{bound} .* widen engine_ports"):
            ports.unbound_port(HOST, range(bound, bound + 1))


def test_the_default_rendezvous_port_is_kept_unless_an_engine_of_this_node_holds_it():
    default, other = free_port(), free_port()
    assert ports.rendezvous_port(HOST, default) == default
    assert ports.rendezvous_port(HOST, default, range(other, other + 1), {default}) == other


def proc_dir(tmp_path: Path, local: str, reserved: str = "") -> Path:
    (tmp_path / "ip_local_port_range").write_text(local + "\n")
    (tmp_path / "ip_local_reserved_ports").write_text(reserved + "\n")
    return tmp_path


def test_engine_ports_in_the_ephemeral_range_are_warned_of_unless_reserved(tmp_path):
    assert ports.ephemeral_ports(proc_dir(tmp_path, "32768\t60999")) == range(32768, 61000)
    assert ports.overlap(range(20000, 30000), tmp_path) is None
    assert ports.overlap(range(30000, 33000), tmp_path) == (
        "232 of engine_ports 30000-32999 (agent.yaml) are in the kernel's ephemeral range 32768-60999 "
        "(net.ipv4.ip_local_port_range), where an outgoing connection can take an engine's port before the engine "
        "binds it; move engine_ports below 32768, or reserve them with net.ipv4.ip_local_reserved_ports")
    proc_dir(tmp_path, "32768 60999", "8080,32768-32999")
    assert ports.reserved_ports(tmp_path) == {8080, *range(32768, 33000)}
    assert ports.overlap(range(30000, 33000), tmp_path) is None


def test_a_node_whose_proc_cannot_be_read_is_taken_to_have_linuxs_defaults(tmp_path):
    assert ports.ephemeral_ports(tmp_path / "absent") == range(32768, 61000)
    assert ports.reserved_ports(tmp_path / "absent") == set()


def test_the_agent_draws_its_engines_ports_from_agent_yamls_engine_ports(tmp_path):
    for name in ("ca.crt", "node.crt", "node.key"):
        (tmp_path / name).write_text("")
    port = free_port()
    (tmp_path / "agent.yaml").write_text(
        'hub: "wss://127.0.0.1:1/"\ntls: {ca: ca.crt, cert: node.crt, key: node.key}\n'
        f"state_dir: {tmp_path / 'state'}\nweights_dirs: [{tmp_path / 'weights'}]\nengine_ports: {port}-{port}\n")
    agent = Agent(Clock(), load_agent_config(tmp_path / "agent.yaml"), "node01",
                  HubAddress("wss://127.0.0.1:1/", "127.0.0.1", 1), platform="linux x86_64", installer=StandInInstaller)
    assert agent.supervisor.rendezvous_port(None) == port
