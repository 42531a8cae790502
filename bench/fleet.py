"""How big a fleet does one server process hold?  Simulated agents against a real `twistd llmgw-server`.

    .venv/bin/python bench/fleet.py [--nodes 1000,5000,10000] [--duration 30] [--interval 5]
                                    [--per-worker 1000] [--agents-nice 10] [--probe 100]
                                    [--no-restart] [--pin] [--profile-s 0] [--profile-restart 0]

For each N it starts one server (its own CA, server.yaml and temporary
directory), then N simulated agents spread over worker processes of
``--per-worker`` each, so the client is not what is measured.  Each agent is
a real mutual-TLS WAMP session with its own node certificate from the
cluster CA, dialled by ``llmgw.link.client.client_service`` (the jittered
backoff real agents use); it registers a recorded inventory from
tests/fixtures/nodes under its own id, registers the node procedures a real
agent does (answering ``ping``, ``logs``, ``start_shard`` and
``stop_shard``; the others refuse in words), and heartbeats every
``--interval`` seconds from a random phase, its GPU figures moving a little
each time.  The heartbeats are CALL messages written once per machine and
sent as they are (``--heartbeats frames``, ``FrameBeats``): the agents
share this machine's cores with the server, so the less they cost the
more the figures are the server's.  ``--heartbeats calls`` sends them
through autobahn's ``session.call`` as a real agent does, at about 1.4
times the agents' CPU.  The agents run at niceness ``--agents-nice`` (10),
their sessions' autogroups too, so that on the cores they share the server
and the operator come first, as on a fleet whose agents have machines of
their own; ``--probe`` of them (100) run in a process at normal priority,
and the heartbeat round trip is theirs: an agent's own wait for a core is
not the server's latency.  ``--agents-nice 0`` shares the cores evenly, as
the runs before this option did.  ``--pin`` puts the server alone on the
first CPU for the steady window (the agents, the probes and this process on
the others), as on a fleet whose agents are elsewhere: niceness says who
runs first, not whose caches the server comes back to.  The catalog asks for one sim model with a replica
per 50 nodes (``--replicas``): an agent keeps a replica it is asked to start as a record,
and reports it, adopted, when it registers again.  One operator (an
operator certificate) holds two sessions: one subscribed to
``llmgw.event.``, as the dashboard is, and one that asks what `ctl` asks and
subscribes to nothing, as ctl.

Printed per N, as a table and one JSON line: server CPU per heartbeat and
as % of a core over ``--duration`` seconds of steady heartbeats, and the
agents' (the worker processes') CPU per heartbeat beside it; the
server's RSS and RSS per node; heartbeat round trip p50/p99 as the probe
agents saw it (as every agent saw it, in the JSON line); ``cp.nodes`` (the whole list a page of 1,000 at a time: each node's
brief, as ``ctl nodes``' table reads it, and each node's whole view, as
``ctl nodes --json`` and the dashboard do; and the ``--state``, ``--label``
and ``--limit`` forms where the server has them), ``cp.replicas`` and a
relayed ``cp.logs`` round trip;
placement time per decision for a catalog of 500 models over N recorded
nodes (in this process, the control plane's own pure functions); and, after
``kill -9`` of the server and a restart, how long until all N are ready
again and how many replicas the control plane started anew (none should
be), with the server's and the agents' CPU while it came back.  ``uptime``'s load is printed with every N, so contention can be told
from cost.  ``--profile-s`` and ``--profile-restart`` record the server with
py-spy in the steady window and from its restart.

It raises its file-descriptor limit to the hard limit and says so (every
session is a socket in the server and in a worker), and sets server.yaml's
``link.max_connections`` (default 1,024) to N + 1,024.  Every process it
starts is stopped by its pid, and its temporary directory removed.  Not a
test: it prints figures and asserts nothing.  ``worker`` is the agents'
process (``python bench/fleet.py worker --help``); tests/control/test_fleet_200.py runs it too.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

FIXTURES = ROOT / "tests" / "fixtures" / "nodes"
# The recorded machines the simulated nodes register as, in turn.
MACHINES = ("h100x8-ib-a-1", "h100x8-ib-a-2", "h100x8-ib-b-1", "rtx4090-workstation", "cpu-box", "vm-8gb")
NODE_PROCEDURES = ("ping", "start_shard", "stop_shard", "drain_shard", "cordon", "logs", "collect_weights",
                   "set_engines")
TWISTD = [sys.executable, "-c", "from twisted.scripts.twistd import run; run()"]


def node_name(prefix: str, i: int) -> str:
    return f"{prefix}{i:05d}"


def inventory_payload(machine: str, node_id: str) -> dict:
    payload = json.loads((FIXTURES / f"{machine}.json").read_text())
    payload.pop("source", None)
    payload["node_id"] = node_id
    payload["shards"] = []
    return payload


#: The engine the simulated agents run replicas of (they start nothing: a replica is a record).
SIM_ENGINE = {"name": "sim", "version": "bench"}


def agent_inventory(machine: str, node_id: str) -> dict:
    """What a simulated agent registers: the recording, on 127.0.0.1 (where its link comes from), with the sim engine."""
    payload = inventory_payload(machine, node_id)
    payload["address"] = "127.0.0.1"
    payload["engines"] = [*(payload.get("engines") or []), SIM_ENGINE]
    return payload


# -- the agents' process --------------------------------------------------------------------------------


def worker_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="fleet.py worker", description="simulated agents in one process")
    parser.add_argument("--hub", required=True)
    parser.add_argument("--pki", required=True, type=Path, help="the cluster CA's directory; node certificates are issued there")
    parser.add_argument("--prefix", default="sim")
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--interval", type=float, default=5.0, help="heartbeat interval, seconds")
    parser.add_argument("--ramp", type=float, default=5.0, help="agents start at random times over this many seconds")
    parser.add_argument("--heartbeats", choices=HEARTBEAT_FORMS, default="frames",
                        help="frames: CALL messages written once per machine and sent as they are; "
                             "calls: autobahn's session.call, as a real agent makes them")
    args = parser.parse_args(argv)

    from twisted.internet import reactor, stdio, task
    from twisted.protocols.basic import LineReceiver

    from llmgw import pki as pkimod
    from llmgw.huburl import parse_hub_url
    from llmgw.link.client import client_service
    from llmgw.tlsfiles import TLSFiles

    names = [node_name(args.prefix, i) for i in range(args.first, args.first + args.count)]
    for name in names:
        if not (args.pki / f"{name}.crt").exists():
            pkimod.issue(args.pki, name, "node")
    hub = parse_hub_url(args.hub)
    stats = Stats()
    beats = FrameBeats(reactor, args.interval) if args.heartbeats == "frames" else None
    services = []
    for i, name in enumerate(names):
        tls = TLSFiles(str(args.pki / "ca.crt"), str(args.pki / f"{name}.crt"), str(args.pki / f"{name}.key"))
        machine = MACHINES[(args.first + i) % len(MACHINES)]
        service = client_service(reactor, hub, tls, _session_factory(reactor, name, machine, args.interval, stats, beats))
        services.append(service)
        reactor.callLater(random.uniform(0, args.ramp), service.startService)

    class Commands(LineReceiver):
        delimiter = b"\n"

        def lineReceived(self, line: bytes) -> None:
            command = line.decode().strip()
            if command == "mark":
                stats.mark()
                self.say("MARKED", {})
            elif command == "report":
                self.say("REPORT", stats.report())
            elif command == "quit":
                reactor.stop()

        def connectionLost(self, reason) -> None:
            if reactor.running:
                reactor.stop()  # the bench went away: so do its agents

        def say(self, word: str, body: dict) -> None:
            self.transport.write(f"{word} {json.dumps(body)}\n".encode())

    # The agents' process collects its garbage as the server does (llmgw.process.fullgc), so that its own
    # full collections (a third of a second at 1,000 sessions) are not what the round trips measure.
    from llmgw.process.fullgc import FullCollections

    FullCollections(reactor, lambda: 0).startService()

    commands = Commands()
    stdio.StandardIO(commands)
    task.LoopingCall(lambda: commands.say("STATUS", stats.status())).start(0.5)
    reactor.run()
    return 0


class Stats:
    """What this process's agents saw: registrations, heartbeat round trips, refusals."""

    def __init__(self):
        self.registered: set[str] = set()
        self.registrations = 0
        self.beats = 0
        self.rtts: list[float] = []
        self.errors: dict[str, int] = {}
        self.logs_answered = 0
        self.starts = 0  # replicas the control plane started here

    def mark(self) -> None:
        self.starts = 0
        self.beats = 0
        self.rtts = []
        self.errors = {}

    def error(self, what: str) -> None:
        self.errors[what] = self.errors.get(what, 0) + 1

    def status(self) -> dict:
        return {"registered": len(self.registered), "registrations": self.registrations, "beats": self.beats,
                "errors": self.errors, "starts": self.starts}

    def report(self) -> dict:
        return {**self.status(), "rtts_ms": [round(r * 1000, 2) for r in self.rtts]}


#: How the simulated agents send their heartbeats (``worker --heartbeats``).
HEARTBEAT_FORMS = ("frames", "calls")


def heartbeat_variants(gpus: list[dict], count: int = 16) -> list[dict]:
    """*count* heartbeats of one machine, its GPU figures moving a little from one to the next.

    A figure the recording does not have (``memory_used_bytes`` absent or
    null) stays absent in every one: absent is not zero.
    """
    variants = []
    for k in range(count):
        variants.append({"gpus": [dict(g, utilization_pct=(k + j) % 4, memory_used_bytes=g["memory_used_bytes"] + (k + 1) * 4096)
                                  if g.get("memory_used_bytes") is not None else g for j, g in enumerate(gpus)]})
    return variants


_HEARTBEATS: dict[str, list[dict]] = {}


def machine_heartbeats(machine: str, gpus: list[dict]) -> list[dict]:
    """*machine*'s ``heartbeat_variants``, made once per worker: a thousand agents of six machines share them."""
    if machine not in _HEARTBEATS:
        _HEARTBEATS[machine] = heartbeat_variants(gpus)
    return _HEARTBEATS[machine]


class FrameBeats:
    """Every agent's heartbeats in one worker, written as WAMP CALL messages by hand.

    At ten thousand nodes the benchmark's own agents cost more CPU per
    heartbeat than the server (autobahn's call path, a Deferred and a
    coroutine per call), on the same two cores, so the round trips measured
    the agents waiting for a CPU.  Here a machine's heartbeats are serialized
    once (``heartbeat_variants``), and each is sent as the text of a CALL
    (``[48, id, {}, "llmgw.cp.agent.heartbeat", [beat]]``, what autobahn
    writes) over the agent's own WebSocket and TLS; the server reads them
    as it reads any agent's.  The request ids start at ``FIRST_ID``, above any the
    session's own counter reaches, and the RESULT or ERROR for one is taken
    from the link before autobahn reads it (autobahn would take a RESULT it
    did not ask for as a protocol violation).  Each agent keeps its own
    random phase and a timer of its own, as real agents started at
    different times do: beats batched into ticks would arrive in bursts.
    """

    FIRST_ID = 1 << 52

    def __init__(self, reactor, interval: float):
        from llmgw.link import uris

        self.reactor, self.interval = reactor, interval
        self.head = b'[48,%d,{},' + json.dumps(uris.AGENT_HEARTBEAT).encode() + b',[%s]]'
        self._frames: dict[str, list[bytes]] = {}  # per machine: every agent of one shares them

    def frames(self, machine: str, variants: list[dict]) -> list[bytes]:
        """*machine*'s heartbeats (``heartbeat_variants``) as JSON text, written the first time one is asked for."""
        if machine not in self._frames:
            self._frames[machine] = [json.dumps(v, separators=(",", ":")).encode() for v in variants]
        return self._frames[machine]


class _Beating:
    """One agent's heartbeats as frames on its link (``FrameBeats``): sent, answered, refused."""

    def __init__(self, session, frames: list[bytes], stats: Stats):
        from llmgw.link import uris

        self.session, self.frames, self.stats = session, frames, stats
        self.not_registered = uris.ERROR_NOT_REGISTERED
        self.link = session._transport
        self.next_id = FrameBeats.FIRST_ID
        self.sent: dict[int, float] = {}  # request id: when it was sent (time.monotonic)
        self.registering = False
        self.timer = None
        heard = self.link.onMessage

        def on_message(payload, is_binary):
            if not is_binary and self.sent and self._answer(payload):
                self.link.heard()  # what the link's own onMessage does first (PingWhenQuiet)
                return
            heard(payload, is_binary)

        self.link.onMessage = on_message

    def start(self, beats: FrameBeats) -> None:
        """Beat every interval from a random phase, until ``stop``."""
        self.beats = beats
        self.due = time.monotonic() + random.uniform(0, beats.interval)
        self.timer = beats.reactor.callLater(self.due - time.monotonic(), self._beat)

    def stop(self) -> None:
        if self.timer is not None and self.timer.active():
            self.timer.cancel()
        self.timer = None

    def _beat(self) -> None:
        beats = self.beats
        # The next beat is due an interval after this one was, not after it ran: no drift.
        self.due += beats.interval
        self.timer = beats.reactor.callLater(max(0.0, self.due - time.monotonic()), self._beat)
        if self.registering or not self.session.is_attached():
            return
        self.next_id += 1
        frame = beats.head % (self.next_id, self.frames[self.next_id % len(self.frames)])
        self.sent[self.next_id] = time.monotonic()
        self.link.sendMessage(frame, False)

    def _answer(self, payload: bytes) -> bool:
        """Whether *payload* answers a heartbeat sent here; if so it is counted and never reaches autobahn."""
        if payload.startswith(b"[50,"):
            try:
                started = self.sent.pop(int(payload[4:payload.find(b",", 4)]), None)
            except ValueError:
                return False
            if started is None:
                return False
            self.stats.beats += 1
            self.stats.rtts.append(time.monotonic() - started)
            return True
        if payload.startswith(b"[8,48,"):
            message = json.loads(payload)
            if self.sent.pop(message[2], None) is None:
                return False
            if message[4] != self.not_registered:
                self.stats.error(message[4])
            elif not self.registering:
                # The control plane restarted behind the same hub: register again, and beat once it has.
                self.stats.registered.discard(self.session.node)
                self.registering = True
                self.session.register_again().addBoth(self._registered)
            return True
        return False

    def _registered(self, _):
        self.registering = False


def _session_factory(reactor, name: str, machine: str, interval: float, stats: Stats, beats: FrameBeats | None = None):
    from autobahn.twisted.wamp import ApplicationSession
    from autobahn.wamp.exception import ApplicationError
    from twisted.internet import task

    from llmgw.link import uris

    inventory = agent_inventory(machine, name)
    variants = machine_heartbeats(machine, inventory.get("gpus") or [])
    frames = beats.frames(machine, variants) if beats is not None else None
    # The replicas the control plane started here, by shard id: what this node reports when it registers
    # again (after the server's restart), as a real agent reports the engines it adopted.
    shards: dict[str, dict] = {}
    port = [20000]

    def refuse(*args, **kwargs):
        raise ApplicationError(uris.ERROR_REFUSED, f"{name} is a simulated node in bench/fleet.py: it runs nothing")

    def start_shard(spec):
        stats.starts += 1
        port[0] += 1
        status = {"spec": spec, "state": "ready", "pid": 100000 + port[0], "since": time.time(),
                  "endpoint": f"http://127.0.0.1:{spec.get('port') or port[0]}"}
        shards[spec["shard_id"]] = status
        return status

    def stop_shard(shard_id):
        status = shards.pop(shard_id, None)
        return dict(status, state="stopped") if status is not None else None

    class SimAgent(ApplicationSession):
        """One node as the control plane sees one: registered, heartbeating, answering ping and logs."""

        node = name

        def onConnect(self):
            self._beat = None
            self._frames = None
            self.join(self.config.realm, authid=name)

        async def onJoin(self, details):
            for procedure in NODE_PROCEDURES:
                handler = {"ping": lambda: {"node_id": name, "version": "bench"}, "logs": self.logs,
                           "start_shard": start_shard, "stop_shard": stop_shard}.get(procedure, refuse)
                await self.register(handler, uris.node_uri(name, procedure))
            await self._register()
            if beats is not None:
                self._frames = _Beating(self, frames, stats)
                self._frames.start(beats)
                return
            # A random phase, as agents started at different times have.
            self._beat = task.LoopingCall(self._heartbeat)
            self._beat.clock = reactor
            reactor.callLater(random.uniform(0, interval), self._start_beating)

        def _start_beating(self):
            if self._beat is not None and self.is_attached():
                self._beat.start(interval, now=True).addErrback(lambda f: stats.error("loop"))

        async def _register(self):
            await self.call(uris.AGENT_REGISTER, dict(inventory, shards=[dict(s, adopted=True) for s in shards.values()]))
            stats.registered.add(name)
            stats.registrations += 1

        def register_again(self):
            from twisted.internet import defer

            return defer.ensureDeferred(self._register()).addErrback(lambda f: stats.error("register"))

        def logs(self, source=None, n=200):
            stats.logs_answered += 1
            return {"node": name, "source": source or "agent", "sources": ["agent"],
                    "lines": [f"{name}: a simulated node's log line {i}" for i in range(min(n, 20))]}

        async def _heartbeat(self):
            beat = random.choice(variants)
            started = time.monotonic()
            try:
                await self.call(uris.AGENT_HEARTBEAT, beat)
            except ApplicationError as e:
                if e.error == uris.ERROR_NOT_REGISTERED:
                    stats.registered.discard(name)
                    await self._register()
                else:
                    stats.error(e.error)
                return
            except Exception as e:
                stats.error(type(e).__name__)
                return
            stats.beats += 1
            stats.rtts.append(time.monotonic() - started)

        def onLeave(self, details):
            if self._beat is not None and self._beat.running:
                self._beat.stop()
            self._beat = None
            if self._frames is not None:
                self._frames.stop()
                self._frames = None
            stats.registered.discard(name)
            super().onLeave(details)

    return SimAgent


# -- the bench ------------------------------------------------------------------------------------------


def raise_fd_limit(needed: int) -> str:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, needed)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    enough = "" if want >= needed else f"; {needed} wanted: raise the hard limit (ulimit -Hn) for the large sizes"
    return f"file descriptors: soft limit {soft} raised to {want} (hard {hard}) for this bench and what it starts{enough}"


def listen_overflows() -> int | None:
    """The kernel's count of connections its accept queues had no room for (TcpExt ListenOverflows), machine-wide."""
    try:
        lines = Path("/proc/net/netstat").read_text().splitlines()
    except OSError:
        return None
    for names, values in zip(lines[::2], lines[1::2]):
        if names.startswith("TcpExt:"):
            row = dict(zip(names.split()[1:], values.split()[1:]))
            return int(row["ListenOverflows"]) if "ListenOverflows" in row else None
    return None


def load() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Run:
    """One N: a server, its workers, its temporary directory."""

    def __init__(self, args, n: int):
        self.args = args
        self.n = n
        self.base = Path(tempfile.mkdtemp(prefix=f"llmgw-fleet-{n}-"))
        self.pki = self.base / "pki"
        self.port = free_port()
        self.hub = f"wss://127.0.0.1:{self.port}/"
        self.server: subprocess.Popen | None = None
        self.workers: list[Worker] = []
        self.probe: Worker | None = None  # also in workers
        # Replicas the catalog asks for (one model, a sim engine): what a restart must adopt, not start again.
        self.replicas = args.replicas if args.replicas is not None else max(1, n // 50)

    def setup(self) -> None:
        from llmgw import pki as pkimod

        pkimod.init_ca(self.pki, name="fleet-bench")
        pkimod.issue(self.pki, "llmgw-server", "server", sans=("localhost", "127.0.0.1"))
        pkimod.issue(self.pki, "alice", "operator")
        (self.base / "server.yaml").write_text(
            f"""listen:
  link: "ssl:{self.port}:interface=127.0.0.1"
  api: null
  admin: null
tls: {{ca: pki/ca.crt, cert: pki/llmgw-server.crt, key: pki/llmgw-server.key}}
link: {{max_connections: {self.n + 1024}}}
profiles:
  bench: {{engine: sim}}
models:
  bench: {{profile: bench, replicas: {self.replicas}}}
"""
        )

    def start_server(self) -> None:
        log = open(self.base / "server.log", "ab")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
        self.server = subprocess.Popen(
            [*TWISTD, "--nodaemon", "--pidfile=", "--logfile=server-twistd.log", "llmgw-server", "--config",
             str(self.base / "server.yaml")],
            stdout=log, stderr=subprocess.STDOUT, cwd=self.base, env=env, start_new_session=True,
        )
        wait(lambda: _listening(self.port) or self.server.poll() is not None, 30, "the hub to listen")
        if self.server.poll() is not None:
            raise SystemExit(f"the server exited:\n{(self.base / 'server.log').read_text()[-3000:]}")

    def kill_server(self) -> None:
        if self.server is not None:
            _kill_group(self.server, wait=15)

    def start_workers(self) -> None:
        per = self.args.per_worker
        probe = min(self.args.probe, self.n - 1) if self.args.agents_nice else 0
        bulk = self.n - probe
        # The fleet arrives at --arrivals agents a second (all workers start at once), as a
        # fleet that boots over a minute would, not in one storm of handshakes.
        ramp = max(2.0, self.n / self.args.arrivals)
        for first in range(0, bulk, per):
            self.workers.append(Worker(self.hub, self.pki, first, min(per, bulk - first), self.args.interval,
                                       self.base / f"worker-{first}.log", ramp=ramp,
                                       heartbeats=self.args.heartbeats, nice=self.args.agents_nice))
        if probe:
            # The last agents, at the server's own priority: their round trips are the server's, not
            # those of a process waiting for a core (``--probe``).
            self.probe = Worker(self.hub, self.pki, bulk, probe, self.args.interval, self.base / f"worker-{bulk}.log",
                                ramp=ramp, heartbeats=self.args.heartbeats)
            self.workers.append(self.probe)

    def stop(self) -> None:
        for w in self.workers:
            w.stop()
        if self.server is not None:
            _stop_group(self.server, kill_wait=15)
        if self.args.keep:
            print(f"kept {self.base}", file=sys.stderr)
        else:
            shutil.rmtree(self.base, ignore_errors=True)

    def registered(self) -> int:
        return sum(w.registered() for w in self.workers)


class Worker:
    """One worker process of simulated agents, talked to over its stdin and stdout (tests/control/test_fleet_200.py uses it too)."""

    def __init__(self, hub: str, pki: Path, first: int, count: int, interval: float, log: Path,
                 ramp: float | None = None, heartbeats: str = "frames", nice: int = 0):
        import threading

        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "worker", "--hub", hub, "--pki", str(pki), "--first", str(first),
             "--count", str(count), "--interval", str(interval),
             "--ramp", str(ramp if ramp is not None else max(2.0, count / 200)), "--heartbeats", heartbeats],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(log, "ab"),
            env=env, start_new_session=True, text=True, bufsize=1,
            preexec_fn=(lambda: _lower_priority(nice)) if nice else None,
        )
        self.status: dict = {}
        self.answers: dict[str, dict] = {}
        self._lock = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def registered(self) -> int:
        return self.status.get("registered", 0)

    def kill(self) -> None:
        """kill -9 the worker and its agents: every session's link closes at once."""
        _kill_group(self.proc, wait=10)

    def _read(self) -> None:
        for line in self.proc.stdout:
            word, _, body = line.partition(" ")
            try:
                value = json.loads(body)
            except ValueError:
                continue
            with self._lock:
                if word == "STATUS":
                    self.status = value
                else:
                    self.answers[word] = value
                    self._lock.notify_all()

    def ask(self, command: str, answer: str, timeout: float = 30) -> dict:
        with self._lock:
            self.answers.pop(answer, None)
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
            if not self._lock.wait_for(lambda: answer in self.answers, timeout):
                raise TimeoutError(f"worker {self.proc.pid} did not answer {command!r} in {timeout} s")
            return self.answers.pop(answer)

    def stop(self) -> None:
        _stop_group(self.proc, kill_wait=10)


def _lower_priority(nice: int) -> None:
    """In a worker before it runs: *nice* for it and for its session's autogroup.

    With the kernel's autogroups (``/proc/sys/kernel/sched_autogroup_enabled``)
    a process's own niceness weighs only against its session's other
    processes, and each worker is a session of its own: the autogroup's is
    the one that gives the server the cores first.
    """
    os.nice(nice)
    try:
        with open("/proc/self/autogroup", "w") as f:
            f.write(str(nice))
    except OSError:
        pass  # no autogroups here: the process's own niceness is what counts


def _kill_group(proc: subprocess.Popen, wait: float) -> None:
    """kill -9 *proc*'s process group (it was started in a session of its own) and reap it."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=wait)


def _stop_group(proc: subprocess.Popen, kill_wait: float) -> None:
    """SIGTERM *proc*'s process group, and kill -9 it if it has not exited 10 s later."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            _kill_group(proc, wait=kill_wait)


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def wait(condition, timeout: float, what: str, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:g} s for {what}")
        time.sleep(interval)


class Operator:
    """One operator session in a thread of its own reactor: calls timed from here."""

    def __init__(self, run: Run):
        from llmgw.huburl import parse_hub_url
        from llmgw.tlsfiles import TLSFiles

        self.hub = parse_hub_url(run.hub)
        self.tls = TLSFiles(str(run.pki / "ca.crt"), str(run.pki / "alice.crt"), str(run.pki / "alice.key"))
        self.events = 0
        self.reactor = _reactor()

    def blocking(self, make, timeout: float = 60):
        """Run the coroutine *make()* on the reactor's thread and wait for it here."""
        import threading

        from twisted.internet import defer

        done = threading.Event()
        box: dict = {}

        def go():
            d = defer.ensureDeferred(make())
            d.addCallbacks(lambda v: box.setdefault("value", v), lambda f: box.setdefault("error", f))
            d.addBoth(lambda _: done.set())

        self.reactor.callFromThread(go)
        if not done.wait(timeout):
            raise TimeoutError(f"the operator's call did not finish in {timeout} s")
        if "error" in box:
            box["error"].raiseException()
        return box["value"]

    def connect(self):
        from autobahn.wamp.types import SubscribeOptions

        from llmgw.link import uris
        from llmgw.link.client import connect_once

        async def go():
            session = await connect_once(self.reactor, self.hub, self.tls, timeout=30)

            def on_event(*args, **kwargs):
                self.events += 1

            await session.subscribe(on_event, uris.EVENT_PREFIX, SubscribeOptions(match="prefix"))
            # What ctl is: a session of its own that subscribes to nothing.  The queries are timed
            # on it, so they do not wait behind the events the dashboard-like session above reads.
            self.watcher = session
            return await connect_once(self.reactor, self.hub, self.tls, timeout=30)

        self.session = self.blocking(go)

    def timed(self, procedure: str, *args, repeat: int = 5, **kwargs) -> tuple[float | None, object]:
        """The median milliseconds of *repeat* calls, and the last answer; None when the server has no such form."""
        return self.timed_coroutine(lambda: self.session.call(procedure, *args, **kwargs), repeat)

    def timed_coroutine(self, make, repeat: int = 5) -> tuple[float | None, object]:
        from autobahn.wamp.exception import ApplicationError

        times = []
        answer = None
        for _ in range(repeat):
            started = time.monotonic()
            try:
                answer = self.blocking(make)
            except ApplicationError as e:
                return None, e.error
            times.append((time.monotonic() - started) * 1000)
        return statistics.median(times), answer

    def all_nodes(self, brief: bool = False, page: int | None = None):
        """The whole node list a page at a time (``views.node_pages``): *brief* as ctl nodes' table reads it."""
        from llmgw.link import uris
        from llmgw.views import NODES_PAGE, node_pages

        return node_pages(lambda after, limit: self.session.call(
            uris.CP_NODES, limit=limit, **({"after": after} if after is not None else {}),
            **({"brief": True} if brief else {})), page or NODES_PAGE)

    def status(self) -> dict | None:
        from llmgw.link import uris

        return self.once(uris.CP_STATUS, timeout=20)

    def once(self, procedure: str, timeout: float = 60):
        """*procedure*'s answer on a session of its own, dialled for it (the first one's server may be gone); None if it fails."""
        from llmgw.link.client import connect_once

        async def go():
            session = await connect_once(self.reactor, self.hub, self.tls, timeout=timeout / 2)
            try:
                return await session.call(procedure)
            finally:
                session.leave()

        try:
            return self.blocking(go, timeout=timeout)
        except Exception:
            return None


def placement_ms(n: int, models: int = 500) -> float:
    """Milliseconds per placement decision: *models* single-rank models over *n* recorded nodes, one after another."""
    from llmgw.control.placement import NodeSnapshot, PlacementRequest, Placement, place
    from llmgw.records import Inventory
    from llmgw.wire import from_wire

    nodes = []
    for i in range(n):
        machine = MACHINES[i % len(MACHINES)]
        inv = from_wire(Inventory, inventory_payload(machine, node_name("sim", i)))
        nodes.append(NodeSnapshot.from_inventory(inv.node_id, "ready", False, inv))
    engines = ("llama.cpp", "vllm")
    started = time.monotonic()
    for m in range(models):
        request = PlacementRequest(model=f"model-{m}", engine=engines[m % 2], gpus=1 + m % 2)
        answer = place(request, nodes)
        if isinstance(answer, Placement):
            nodes = answer.apply_to(nodes, request.model)
    return (time.monotonic() - started) * 1000 / models


def _cpu_s(procs) -> float:
    """The user plus system CPU seconds of *procs* (psutil processes), summed."""
    return sum(sum(p.cpu_times()[:2]) for p in procs)


def _pin(server, agents) -> list:
    """The window's CPUs: the server alone on the first; its agents and this process (every thread) on the rest."""
    import psutil

    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("--pin needs two CPUs at least")
    me = psutil.Process()
    saved = [(p, p.cpu_affinity()) for p in (server, me, *agents)]
    _affinity(server, cpus[:1])
    for p in (me, *agents):
        _affinity(p, cpus[1:])
    return saved


def _unpin(saved: list) -> None:
    for p, cpus in saved:
        _affinity(p, cpus)


def _affinity(proc, cpus: list[int]) -> None:
    """*cpus* for every thread of *proc*: sched_setaffinity on a pid sets only its first thread's
    (this process's reactor thread holds the operator's sessions)."""
    for thread in proc.threads():
        try:
            os.sched_setaffinity(thread.id, cpus)
        except ProcessLookupError:  # it ended meanwhile
            pass


def measure(args, n: int) -> dict:
    import psutil

    from llmgw.link import uris

    run = Run(args, n)
    row: dict = {"nodes": n, "load_before": load()}
    try:
        run.setup()
        run.start_server()
        server = psutil.Process(run.server.pid)
        rss_empty = server.memory_info().rss
        started = time.monotonic()
        overflows = listen_overflows()
        run.start_workers()
        try:
            wait(lambda: run.registered() >= n or any(w.proc.poll() is not None for w in run.workers),
                 args.connect_timeout, f"{n} agents to register")
        except TimeoutError as e:
            run.args.keep = True  # its logs say why
            raise SystemExit(f"{e}: {run.registered()} did, under load {load()}; the server's log is in {run.base}")
        if any(w.proc.poll() is not None for w in run.workers):
            raise SystemExit("a worker exited; its log is in " + str(run.base))
        row["register_s"] = round(time.monotonic() - started, 1)
        row["listen_overflows_register"] = _since(overflows, listen_overflows())
        operator = Operator(run)
        operator.connect()
        row["replicas"] = run.replicas
        row["replicas_ready_s"] = _wait_replicas(operator, run.replicas, started, args.connect_timeout)
        time.sleep(args.interval)  # every agent's first heartbeat, from its random phase
        for w in run.workers:
            w.ask("mark", "MARKED")
        agents = [psutil.Process(w.proc.pid) for w in run.workers]
        pinned = _pin(server, agents) if args.pin else None
        agents_cpu0 = _cpu_s(agents)
        server0 = server.cpu_times()
        t0 = time.monotonic()
        try:
            if args.profile_s:
                _profile(run, args.profile_s, native=args.profile_native)
            time.sleep(max(0.0, args.duration - (time.monotonic() - t0)))
            server1 = server.cpu_times()
        finally:
            if pinned is not None:
                _unpin(pinned)
        cpu_s = sum(server1[:2]) - sum(server0[:2])
        sys_s = server1.system - server0.system
        agents_cpu_s = _cpu_s(agents) - agents_cpu0
        window = time.monotonic() - t0
        reports = [w.ask("report", "REPORT") for w in run.workers]
        beats = sum(r["beats"] for r in reports)
        rtts = [x for r in reports for x in r["rtts_ms"]]
        probed = reports[run.workers.index(run.probe)]["rtts_ms"] if run.probe is not None else rtts
        rss = server.memory_info().rss
        row.update(
            window_s=round(window, 1), heartbeats=beats,
            cpu_ms_per_heartbeat=round(cpu_s * 1000 / beats, 3) if beats else None,
            cpu_pct_of_core=round(100 * cpu_s / window, 1),
            cpu_sys_ms_per_heartbeat=round(sys_s * 1000 / beats, 3) if beats else None,
            pinned=bool(args.pin),
            # What the simulated agents cost, on the same cores: past the server's own, they crowd it.
            agents_cpu_ms_per_heartbeat=round(agents_cpu_s * 1000 / beats, 3) if beats else None,
            agents_cpu_pct_of_core=round(100 * agents_cpu_s / window, 1),
            heartbeat_rtt_p50_ms=percentile(probed, 0.5), heartbeat_rtt_p99_ms=percentile(probed, 0.99),
            heartbeat_rtt_probed=len(probed),
            all_agents_rtt_p50_ms=percentile(rtts, 0.5), all_agents_rtt_p99_ms=percentile(rtts, 0.99),
            heartbeat_errors=sum(sum(r["errors"].values()) for r in reports),
            rss_mb=round(rss / 2**20, 1), rss_kb_per_node=round((rss - rss_empty) / 1024 / n, 1),
        )
        def ask(key: str, timed) -> object:
            """One query's median ms into *key*; a query that fails is recorded, and the operator dials again."""
            row[key] = None
            if getattr(operator, "session", None) is None:
                return None  # its link is gone and dialling again failed: the row says so
            try:
                row[key], answer = timed()
                return answer
            except Exception as e:
                row.setdefault("query_errors", []).append(f"{key}: {type(e).__name__}: {e}"[:200])
                try:
                    operator.connect()
                except Exception as again:
                    operator.session = None
                    row["query_errors"].append(f"the operator could not dial again: {again}"[:200])
                return None

        if _has_paging():  # the whole list as ctl nodes reads it, a page of 1,000 at a time
            listing = ask("cp_nodes_ms", lambda: operator.timed_coroutine(operator.all_nodes))
        else:  # a server from before paging: one answer (past about 9,000 8-GPU nodes, more than 16 MiB)
            listing = ask("cp_nodes_ms", lambda: operator.timed(uris.CP_NODES))
        row["cp_nodes_count"] = len(listing) if isinstance(listing, list) else None
        if _has_briefs():  # the whole list as ctl nodes' table reads it: each node's brief
            briefs = ask("cp_nodes_brief_ms", lambda: operator.timed_coroutine(lambda: operator.all_nodes(brief=True)))
            row["cp_nodes_brief_count"] = len(briefs) if isinstance(briefs, list) else None
            ask("cp_nodes_brief2000_ms", lambda: operator.timed_coroutine(lambda: operator.all_nodes(brief=True, page=2000)))
            ask("cp_nodes_brief_page_ms", lambda: operator.timed(uris.CP_NODES, brief=True, limit=1000))
        ask("cp_nodes_unreachable_ms", lambda: operator.timed(uris.CP_NODES, state="unreachable"))
        ask("cp_nodes_label_ms", lambda: operator.timed(uris.CP_NODES, label="gpu=h100", limit=1000))
        ask("cp_nodes_limit_ms", lambda: operator.timed(uris.CP_NODES, limit=50))
        ask("cp_replicas_ms", lambda: operator.timed(uris.CP_REPLICAS))
        ask("cp_logs_ms", lambda: operator.timed(uris.CP_LOGS, node_name("sim", random.randrange(n))))
        row["events_seen"] = operator.events
        row["load_after"] = load()
        if args.restart:
            row.update(_restart(run, operator, n, args))
    finally:
        run.stop()
    row["placement_ms_per_decision"] = round(placement_ms(n), 2)
    return row


def _profile(run: Run, seconds: float, phase: str = "window", wait: bool = True, native: bool = False):
    """py-spy (``pip install py-spy``) records the server for *seconds*; collapsed stacks beside the temp dirs.

    Without *wait*, the recording goes on while the caller does; it returns the recorder's process.
    With *native*, the stacks go down into C and the kernel's calls (``epoll_ctl``, ``send``); py-spy
    then pauses the server for each sample, so the run's own figures are not comparable.
    """
    out = run.base.parent / f"llmgw-fleet-{run.n}-{phase}-profile.txt"
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    proc = subprocess.Popen([spy, "record", "--pid", str(run.server.pid), "--duration", str(int(seconds)),
                             "--format", "raw", "--rate", "50", "-o", str(out), "--native" if native else "--nonblocking"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print(f"py-spy profile of the server's {phase} (collapsed stacks): {out}", file=sys.stderr)
    if not wait:
        return proc
    proc.wait(timeout=seconds + 60)
    return None


def _has_briefs() -> bool:
    from llmgw import views

    return hasattr(views, "NodeBrief")


def _has_paging() -> bool:
    """Whether this llmgw pages cp.nodes (the bench also runs against an older tree, to compare)."""
    from llmgw import views

    return hasattr(views, "node_pages")


def _restart(run: Run, operator: Operator, n: int, args) -> dict:
    """kill -9 the server, start it again, and time the fleet's return (agents' own backoff).

    Then count what the agents were asked to start after the restart: the
    replicas they reported when they registered again are adopted, so the
    answer should be none.
    """
    import psutil

    for w in run.workers:
        w.ask("mark", "MARKED")
    overflows = listen_overflows()
    agents = [psutil.Process(w.proc.pid) for w in run.workers]
    agents_cpu0 = _cpu_s(agents)
    run.kill_server()
    killed = time.monotonic()
    run.start_server()
    server = psutil.Process(run.server.pid)
    spy = (_profile(run, args.profile_restart, "restart", wait=False, native=args.profile_native)
           if args.profile_restart else None)
    deadline = killed + args.restart_timeout
    ready = 0
    row: dict = {"reregistered_s": None, "reregistered": 0}
    while time.monotonic() < deadline:
        status = operator.status()
        ready = (status or {}).get("nodes", {}).get("ready", 0)
        if ready >= n:
            row = {"reregistered_s": round(time.monotonic() - killed, 1), "reregistered": ready}
            break
        time.sleep(0.5)
    else:
        row["reregistered"] = ready
    # Who had the cores while the fleet came back: a server short of 100 % of
    # its core was waiting for the agents (their own handshakes, here on the
    # same cores), not the other way round.
    back = time.monotonic() - killed
    row["restart_server_cpu_pct"] = round(100 * _cpu_s([server]) / back, 1)
    row["restart_agents_cpu_pct"] = round(100 * (_cpu_s(agents) - agents_cpu0) / back, 1)
    row["listen_overflows_restart"] = _since(overflows, listen_overflows())
    if spy is not None:
        spy.wait()
    time.sleep(5)  # a reconciler pass or more with the whole fleet back: what would it start?
    reports = [w.ask("report", "REPORT") for w in run.workers]
    row["started_after_restart"] = sum(r.get("starts", 0) for r in reports)
    row["errors_after_restart"] = sum(sum(r["errors"].values()) for r in reports)
    row["replicas_ready_after_restart"] = _ready_replicas(operator)
    return row


def _since(before: int | None, after: int | None) -> int | None:
    return None if before is None or after is None else after - before


def _wait_replicas(operator: Operator, want: int, started: float, timeout: float) -> float | None:
    """Seconds from the first agent's start until ``cp.replicas`` says *want* are ready; None if they never were."""
    from llmgw.link import uris

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        views = operator.blocking(lambda: operator.session.call(uris.CP_REPLICAS))
        if sum(1 for v in views if v.get("state") == "ready") >= want:
            return round(time.monotonic() - started, 1)
        time.sleep(1)
    return None


def _ready_replicas(operator: Operator) -> int | None:
    """How many replicas ``cp.replicas`` says are ready, from a session of its own (the old one's server is gone)."""
    from llmgw.link import uris

    views = operator.once(uris.CP_REPLICAS)
    return None if views is None else sum(1 for v in views if v.get("state") == "ready")


_RUNNING: list = []


def _reactor():
    """Twisted's reactor, running in a thread of this process from the first call on."""
    import threading

    from twisted.internet import reactor

    if not _RUNNING:
        threading.Thread(target=reactor.run, kwargs={"installSignalHandlers": False}, daemon=True).start()
        _RUNNING.append(reactor)
    return reactor

COLUMNS = [
    ("nodes", "nodes"), ("cpu_ms_per_heartbeat", "ms CPU/hb"), ("cpu_pct_of_core", "% core"),
    ("agents_cpu_ms_per_heartbeat", "agents ms/hb"), ("rss_mb", "RSS MB"), ("rss_kb_per_node", "KB/node"), ("heartbeat_rtt_p50_ms", "hb p50 ms"),
    ("heartbeat_rtt_p99_ms", "hb p99 ms"), ("cp_nodes_brief_ms", "ctl nodes ms"), ("cp_nodes_ms", "all views ms"), ("cp_nodes_limit_ms", "--limit 50 ms"),
    ("cp_nodes_unreachable_ms", "--state ms"), ("cp_replicas_ms", "replicas ms"), ("cp_logs_ms", "logs ms"),
    ("placement_ms_per_decision", "place ms"), ("reregistered_s", "back in s"),
    ("started_after_restart", "started again"),
]


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):  # a cost per heartbeat is read to the microsecond
        return f"{value:.3f}" if abs(value) < 1 else f"{value:.1f}"
    return str(value)


def main(argv: list[str]) -> int:
    if argv[:1] == ["worker"]:
        return worker_main(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", default="1000,5000,10000", help="comma-separated fleet sizes")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of steady heartbeats measured per size")
    parser.add_argument("--interval", type=float, default=5.0, help="heartbeat interval (agent.yaml's default is 5)")
    parser.add_argument("--per-worker", type=int, default=1000, help="simulated agents per worker process")
    parser.add_argument("--arrivals", type=float, default=100.0, help="agents started per second at first")
    parser.add_argument("--connect-timeout", type=float, default=600.0, help="most seconds for the fleet to register")
    parser.add_argument("--restart-timeout", type=float, default=120.0, help="most seconds for it to register again")
    parser.add_argument("--replicas", type=int, default=None,
                        help="replicas of the one sim model the catalog asks for (default: one per 50 nodes)")
    parser.add_argument("--heartbeats", choices=HEARTBEAT_FORMS, default="frames",
                        help="how the simulated agents send heartbeats: frames (written once, sent as they are; "
                             "the default) or calls (autobahn's session.call, about 1.4 times the agents' CPU)")
    parser.add_argument("--agents-nice", type=int, default=10,
                        help="run the simulated agents at this niceness, their sessions' autogroups too, so that "
                             "the server and the operator come first on the cores they share, as on a fleet of "
                             "machines (default 10; 0 shares the cores evenly)")
    parser.add_argument("--probe", type=int, default=100,
                        help="with --agents-nice: this many of the N agents run in a process at normal priority, "
                             "and the heartbeat round trip is theirs (default 100)")
    parser.add_argument("--no-restart", dest="restart", action="store_false", help="skip the kill -9 and restart")
    parser.add_argument("--pin", action="store_true",
                        help="in the window, the server alone on one CPU and the agents on the others")
    parser.add_argument("--profile-s", type=float, default=0, help="py-spy the server for this long in the window")
    parser.add_argument("--profile-native", action="store_true",
                        help="with --profile-s or --profile-restart: native stacks too (py-spy --native, which "
                             "pauses the server per sample)")
    parser.add_argument("--profile-restart", type=float, default=0,
                        help="py-spy the restarted server for this long from its start")
    parser.add_argument("--keep", action="store_true", help="keep each size's temporary directory (logs)")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.nodes.split(",") if s.strip()]
    # The operator's sessions collect garbage as ctl's and the dashboard's processes do.
    from llmgw.ctl.main import fewer_collections

    fewer_collections()
    # SIGTERM (or timeout(1)) unwinds like Ctrl-C, so every process started is stopped and every directory removed.
    # A second SIGTERM while it unwinds is ignored, so the unwinding finishes.
    def unwind(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, unwind)
    # The server holds a socket per agent, a worker one per agent it runs; each has its own limit.
    print(raise_fd_limit(max(sizes) + 2048), file=sys.stderr)

    rows = []
    for n in sizes:
        row = measure(args, n)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print()
    print("  ".join(f"{title:>{max(len(title), 6)}}" for _, title in COLUMNS))
    for row in rows:
        print("  ".join(f"{_cell(row.get(key)):>{max(len(title), 6)}}" for key, title in COLUMNS))
    for row in rows:
        print(f"  {row['nodes']}: {row['load_after'] if 'load_after' in row else row['load_before']}")
    if _RUNNING:
        _RUNNING[0].callFromThread(_RUNNING[0].stop)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
