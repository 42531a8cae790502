"""Engine supervision: start, watch, drain, stop and adopt the shards of one node.

The supervisor launches each engine in a process group of its own with its
output going straight to a log file, and writes the full ShardSpec beside
the engine's pid, so that engines outlive their agent and a restarted agent
adopts them instead of orphaning them. See docs/supervision.rst.

It knows nothing about engines: the agent injects ``planner(spec, port) ->
LaunchPlan`` (normally a call to ``llmgw.engines.adapter_for(...).plan``).
It knows nothing about the link either: every transition goes to
``report(ShardStatus)``.
"""

from __future__ import annotations

import collections
import os
import secrets
import shlex
import signal
import sys
import time
from pathlib import Path
from typing import Callable

import attrs
import psutil
from twisted.internet import defer
from twisted.logger import Logger

from llmgw.agent.health import HttpProbe, Joins
from llmgw.agent.logtail import LogFollower, append_line
from llmgw.agent.lifecycle import ShardInput, ShardLifecycle
from llmgw.agent import ports
from llmgw.agent.procs import (ProcessIdentity, group_alive, identify, is_alive, launcher_argv, marked_processes,
                               marker_env, signal_group)
from llmgw.agent.shard import ChildProtocol, Context, ShardRunner
from llmgw.agent.statefiles import Record, RecordError, StateDir
from llmgw.engines.base import LaunchPlan
from llmgw.records import ShardSpec, ShardStatus
from llmgw.states import ShardState

log = Logger()

# A log bigger than this when its shard starts again is moved to <name>.log.1,
# so restarts do not grow one file forever. Within one run, rotate with
# logrotate's copytruncate: the engine holds the file open.
ROTATE_BYTES = 64 << 20
# Finished shards kept for their tails, most recent last.
KEEP_FINISHED = 32
#: How long a failed shard stays among the node's log sources.
FAILED_SOURCE_S = 600.0
#: Launches of one start of a shard whose engine each time found its port taken.
PORT_TRIES = 3

Planner = Callable[[ShardSpec, int], LaunchPlan]


class UnknownShard(LookupError):
    """This node runs no shard of that id; ask the control plane which node does."""


class Supervisor:
    def __init__(self, reactor, state_dir: Path, planner: Planner, report: Callable[[ShardStatus], None],
                 host: str = "127.0.0.1", clock=None, poll_interval: float = 1.0, health_interval: float = 0.25,
                 tail_lines: int = 300, stop_grace_s: float = 10, *, probe_timeout_s: float = 2.0,
                 failure_tail_lines: int = 50, kill_wait_s: float = 5.0, join_timeout_s: float = 20.0,
                 engine_ports: range = ports.DEFAULT_RANGE, port_tries: int = PORT_TRIES):
        self._reactor = reactor
        self._clock = clock if clock is not None else reactor
        probe = HttpProbe(reactor, self._clock, probe_timeout_s)
        self._files = StateDir(state_dir)
        self._planner = planner
        self._host = host
        self._ports, self._port_tries = engine_ports, port_tries
        if (overlap := ports.overlap(engine_ports)) is not None:
            log.warn("{overlap}", overlap=overlap)
        self._tail_lines = tail_lines
        self._ctx = Context(
            clock=self._clock,
            files=self._files,
            probe=probe,
            report=report,
            poll_interval=poll_interval,
            health_interval=health_interval,
            stop_grace_s=stop_grace_s,
            kill_wait_s=kill_wait_s,
            failure_tail_lines=failure_tail_lines,
            joins=Joins(reactor, self._clock, probe, join_timeout_s),
        )
        self._shards: dict[str, ShardRunner] = {}
        self._planning: int | None = None  # the port of the engine being planned now

    @property
    def state_dir(self) -> Path:
        return self._files.root

    # -- commands -------------------------------------------------------------

    def start(self, spec: ShardSpec, life: ShardLifecycle | None = None) -> ShardStatus:
        """Launch *spec*'s engine, or return the status of the one already running.

        *life* is the shard's lifecycle when it began before this (fetching its
        weights), now starting; a fresh one otherwise.  A shard being stopped
        is not started again until it has stopped: its current status
        (draining) comes back and the control plane asks again.
        """
        current = self._shards.get(spec.shard_id)
        if current is not None and not current.finished:
            return current.status()
        life = life if life is not None else ShardLifecycle()
        if life.state != ShardState.STARTING:
            raise ValueError(f"shard {spec.shard_id} is {life.state}: only a starting shard is launched")
        return self._launch(spec, life, tries=1)

    def rendezvous_port(self, default: int | None) -> int:
        """Where rank 0 of a multi-node replica started now is met: see ``ports.rendezvous_port``."""
        return ports.rendezvous_port(self._host, default, self._ports, self._held_ports())

    def _launch(self, spec: ShardSpec, life: ShardLifecycle, tries: int) -> ShardStatus:
        try:
            port = spec.port if spec.port is not None else ports.unbound_port(self._host, self._ports, self._held_ports())
            self._planning = port  # so that a rendezvous port the planner asks for is another
            plan = self._planner(spec, port)
            if not plan.argv:
                raise ValueError("the plan has no command to run")
        except Exception as e:
            return self._refuse(spec, life, f"could not plan its launch: {e}")
        finally:
            self._planning = None

        log_path = self._files.log_path(spec.shard_id)
        if LogFollower.size(log_path) > ROTATE_BYTES:
            try:
                os.replace(log_path, log_path.with_name(log_path.name + ".1"))
            except OSError as e:
                log.warn("shard {shard}: could not rotate {path}: {e}", shard=spec.shard_id, path=str(log_path), e=e)
        offset = LogFollower.size(log_path)
        append_line(log_path, f"llmgw: {_iso(time.time())} starting {spec.shard_id} on port {port}: "
                              f"{shlex.join(plan.argv)}")
        child = ChildProtocol()
        run = secrets.token_hex(8)
        try:
            transport = self._spawn(child, spec, plan, log_path, run)
        except (OSError, TypeError, ValueError) as e:
            return self._refuse(spec, life, f"could not launch {plan.argv[0]}: {e}")

        pid = transport.pid
        identity = identify(pid) or ProcessIdentity(pid, 0.0)
        record = Record(
            pid=pid, pgid=pid, create_time=identity.create_time, spec=spec, endpoint=_endpoint(self._host, port),
            host=self._host, port=port, health=plan.health.path if plan.health is not None else None,
            started_at=self._clock.seconds(), log=log_path.name, log_offset=offset, run=run,
        )
        try:
            self._files.write(record)
        except OSError as e:
            signal_group(pid, signal.SIGKILL, leader=pid)
            return self._refuse(spec, life, f"could not write its record ({e}); engine killed, since an agent "
                                      "restart could not have described it")

        follower = LogFollower(log_path, keep=self._tail_lines, offset=offset)
        shard = ShardRunner(self._ctx, record, follower, child=child, life=life,
                            rendezvous_port=plan.rendezvous_port, joined=plan.joined,
                            port_taken=self._started_elsewhere, tries=tries)
        self._keep(shard)
        shard.begin()
        # Not shard's own status: an engine that found its port taken at once is another runner's now.
        return self._shards[spec.shard_id].status()

    def stop(self, shard_id: str) -> defer.Deferred:
        """SIGTERM to the engine's group, SIGKILL after the grace period; fires
        with the final status, or None for a shard this node does not run."""
        shard = self._shards.get(shard_id)
        if shard is None:
            return defer.succeed(None)
        return shard.stop()

    def drain(self, shard_id: str) -> ShardStatus:
        """Mark the shard draining: the router sends it nothing new. Stopping
        it remains the control plane's decision."""
        shard = self._live(shard_id)
        if shard.drain():
            try:
                shard.record = attrs.evolve(shard.record, draining=True)
                self._files.write(shard.record)
            except OSError as e:
                log.warn("shard {shard}: could not record that it drains: {e}", shard=shard_id, e=e)
        return shard.status()

    def adopt_all(self) -> list[ShardStatus]:
        """Take over the engines a previous agent on this state directory left running.

        A record whose engine is gone is removed. A live engine that cannot be
        described — its record unreadable, or no record at all for a group this
        state directory's agent started — is killed.
        """
        adopted = []
        for path in self._files.records():
            try:
                record = self._files.read(path)
            except RecordError as e:
                self._unreadable(path, e)
                continue
            shard_id = record.spec.shard_id
            if not is_alive(ProcessIdentity(record.pid, record.create_time)):
                log.info("shard {shard}: its engine (pid {pid}) is gone; record removed", shard=shard_id, pid=record.pid)
                self._files.remove(path)
                continue
            current = self._shards.get(shard_id)
            if current is not None and not current.finished:
                continue  # already ours
            if _pgid(record.pid) != record.pgid or record.pgid == os.getpgrp():
                self._unreadable(path, RecordError(f"pid {record.pid} does not lead a process group of its own",
                                                   record.pid, record.create_time))
                continue
            adopted.append(self._adopt(record))
        live = [s.record for s in self._shards.values() if not s.finished]
        claimed_groups, claimed_runs = {r.pgid for r in live}, {r.run for r in live}
        groups = collections.defaultdict(list)
        for proc in marked_processes(self._files.root):
            # A worker that left its engine's group is still that engine's.
            if proc.pgid not in claimed_groups and proc.run not in claimed_runs:
                groups[proc.pgid].append(proc)
        for pgid, procs in groups.items():
            named = procs[0].shard_id or "no shard"
            self._kill_undescribed(pgid, procs[0].pid, procs[0].cmdline,
                                   f"it was started for {named} by an agent on this state directory, "
                                   "but no record describes it")
        return adopted

    def close(self) -> None:
        """Stop watching, leave every engine running: what an agent that exits does."""
        for shard in self._shards.values():
            shard.close()

    # -- queries --------------------------------------------------------------

    def statuses(self) -> list[ShardStatus]:
        """Every shard this node is running or adopted (for register)."""
        return [s.status() for s in self._shards.values() if not s.finished]

    def tail(self, shard_id: str, n: int | None = None) -> list[str]:
        shard = self._shards.get(shard_id)
        if shard is None:
            raise UnknownShard(f"no shard {shard_id} on this node; sources are: {', '.join(self.sources()) or 'none'}")
        if not shard.finished:
            shard.follower.poll()
        return shard.follower.last(self._tail_lines if n is None else n)

    def sources(self, now: float | None = None) -> list[str]:
        """The shards whose logs an operator is offered: those running, and those that
        failed in the last ``FAILED_SOURCE_S`` (why they failed is in there).  A shard
        stopped on purpose (its model removed or moved) is not offered; ``tail`` still
        reads any shard this supervisor holds."""
        now = self._clock.seconds() if now is None else now
        return [sid for sid, s in self._shards.items()
                if not s.finished or (s.life.state == ShardState.FAILED and now - s.since <= FAILED_SOURCE_S)]

    # -- the rest -------------------------------------------------------------

    def _spawn(self, child: ChildProtocol, spec: ShardSpec, plan: LaunchPlan, log_path: Path, run: str):
        env = {**os.environ, **plan.env, **marker_env(self._files.root, spec.shard_id, run)}
        out = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            null = os.open(os.devnull, os.O_RDONLY)
            try:
                # stdout and stderr are the log file itself, not pipes to
                # this process: the engine must outlive its agent.
                return self._reactor.spawnProcess(child, sys.executable, launcher_argv(list(plan.argv)), env=env,
                                                  childFDs={0: null, 1: out, 2: out})
            finally:
                os.close(null)
        finally:
            os.close(out)

    def _adopt(self, record: Record) -> ShardStatus:
        log_path = self._files.shards / record.log
        follower = LogFollower(log_path, keep=self._tail_lines, offset=record.log_offset)
        if not follower.read_back(max_bytes=self._tail_lines * 1024):
            follower.lines.append(f"llmgw: this engine's earlier output is gone: {log_path} is missing")
        life = ShardLifecycle(ShardState.DRAINING if record.draining else ShardState.STARTING)
        shard = ShardRunner(self._ctx, record, follower, child=None, life=life)
        shard.note(f"{_iso(time.time())} adopted by a restarted agent (pid {record.pid}); "
                   "output above this line was read back from the log file")
        log.info("shard {shard}: adopted its running engine, pid {pid}", shard=record.spec.shard_id, pid=record.pid)
        self._keep(shard)
        shard.begin()
        return shard.status()

    def _held_ports(self) -> set[int]:
        """The ports this node's engines serve or are met at, or will once started."""
        live = [s for s in self._shards.values() if not s.finished]
        held = {s.record.port for s in live} | {s.rendezvous_port for s in live if s.rendezvous_port is not None}
        return held if self._planning is None else held | {self._planning}

    def _started_elsewhere(self, shard: ShardRunner, how: str) -> bool:
        """Start again, on other ports, an engine that exited while starting because another process holds its port.

        Each engine says so in its own words (llama-server "couldn't bind HTTP
        server socket", vLLM's uvicorn "[Errno 98] ... address already in use",
        the sim "cannot listen on"), so the agent looks at the fact instead:
        the engine's whole group is gone and its port is bound all the same.
        A port the spec names is the control plane's to move, not the node's.
        """
        record = shard.record
        if shard.adopted or shard.tries >= self._port_tries:
            return False
        taken = [p for p in (record.port, shard.rendezvous_port) if p is not None and ports.port_in_use(record.host, p)]
        if not taken or shard.spec.port in taken or group_alive(record.pgid):
            return False
        why = (f"{how}: port {', '.join(map(str, taken))} is held by another process; "
               f"starting it again on another (launch {shard.tries + 1} of {self._port_tries})")
        log.warn("shard {shard}: {why}", shard=shard.spec.shard_id, why=why)
        shard.hand_over(why)
        del self._shards[shard.spec.shard_id]
        self._launch(shard.spec, shard.life, shard.tries + 1)
        return True

    def _unreadable(self, path: Path, error: RecordError) -> None:
        if error.pid is not None and is_alive(ProcessIdentity(error.pid, error.create_time)):
            self._kill_undescribed(None, error.pid, _cmdline(error.pid), f"its record {path.name} is unusable: {error}")
        else:
            log.warn("{path}: unusable shard record ({e}); no live engine matches it. Set aside as {aside}",
                     path=str(path), e=error, aside=path.name + ".unreadable")
        try:
            self._files.set_aside(path)
        except OSError:
            self._files.remove(path)

    def _kill_undescribed(self, pgid: int | None, pid: int, cmdline: str, why: str) -> None:
        try:
            pgid = os.getpgid(pid) if pgid is None else pgid
            if pid == os.getpid() or pgid == os.getpgrp():
                # Every engine leads a group of its own; one in ours is not an
                # engine, whatever a damaged record says.
                raise ValueError("it is in this agent's own process group")
            signal_group(pgid, signal.SIGKILL, leader=pid)
        except (OSError, ValueError) as e:
            log.error("could not kill process group {pgid} ({cmdline}): {e}", pgid=pgid, cmdline=cmdline, e=e)
            return
        log.warn("killed process group {pgid} ({cmdline}): {why}. A process holding GPUs that nothing can "
                 "describe is worse than none, because placement hands those GPUs out again.",
                 pgid=pgid, cmdline=cmdline, why=why)

    def _live(self, shard_id: str) -> ShardRunner:
        shard = self._shards.get(shard_id)
        if shard is None or shard.finished:
            raise UnknownShard(f"no running shard {shard_id} on this node")
        return shard

    def _keep(self, shard: ShardRunner) -> None:
        self._shards.pop(shard.spec.shard_id, None)
        self._shards[shard.spec.shard_id] = shard
        finished = [sid for sid, s in self._shards.items() if s.finished]
        for sid in finished[:max(0, len(finished) - KEEP_FINISHED)]:
            del self._shards[sid]

    def _refuse(self, spec: ShardSpec, life: ShardLifecycle, reason: str) -> ShardStatus:
        log.error("shard {shard}: {reason}", shard=spec.shard_id, reason=reason)
        life.fire(ShardInput.REFUSED)
        status = ShardStatus(spec=spec, state=life.wire_state, reason=reason, output_tail=[],
                             adopted=False, since=self._clock.seconds())
        try:
            self._ctx.report(status)
        except Exception:
            log.failure("reporting shard {shard} failed", shard=spec.shard_id)
        return status


def _endpoint(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(t))


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _cmdline(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline())[:200]
    except psutil.Error:
        return f"pid {pid}"
