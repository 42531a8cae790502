"""One shard on this node: carrying its lifecycle out, while its weights come and once its engine runs.

``llmgw.agent.lifecycle`` is the state machine alone.  ``ShardFetch`` holds
a shard's machine while its weights are fetched, before any engine exists;
``ShardRunner`` takes the machine over once the engine is launched (or
adopted): it watches the engine, probes it, signals its process group, and
reports every change of state through the one ``report`` callable the
supervisor was given.
"""

from __future__ import annotations

import inspect
import signal
from typing import Callable

import attrs
from twisted.internet import defer, protocol, task
from twisted.logger import Logger

from llmgw.agent.health import HttpProbe, Joins
from llmgw.agent.logtail import LogFollower, append_line
from llmgw.agent.lifecycle import ShardInput, ShardLifecycle
from llmgw.agent.procs import ProcessIdentity, describe_exit, group_alive, is_alive, kill_run, signal_group
from llmgw.agent.statefiles import Record, StateDir
from llmgw.engines.base import Joined, host_port
from llmgw.records import ShardSpec, ShardStatus
from llmgw.states import ShardState

log = Logger()


@attrs.define
class Context:
    """What every shard shares with its supervisor."""

    clock: object
    files: StateDir
    probe: HttpProbe
    report: Callable[[ShardStatus], None]
    poll_interval: float
    health_interval: float
    stop_grace_s: float
    kill_wait_s: float
    failure_tail_lines: int
    joins: Joins | None = None


class ShardFetch:
    """A shard waiting for its weights: the first part of its lifecycle, before any engine exists.

    It ends one of three ways: the weights arrive (``FETCHED``: the machine,
    now starting, goes on to a ``ShardRunner``), the fetch fails, or the shard
    is stopped first.  *download* is the fetch's Deferred, cancelled by a stop.
    """

    def __init__(self, spec: ShardSpec, clock, download: defer.Deferred):
        self.spec = spec
        self.life = ShardLifecycle(ShardState.FETCHING)
        self.download = download
        self.reason: str | None = None
        self.since = clock.seconds()
        self._clock = clock

    def fire(self, event: ShardInput, reason: str | None = None) -> bool:
        """Move the machine on; False when this state ignores *event*."""
        if self.life.fire(event) is None:
            return False
        self.since = self._clock.seconds()
        self.reason = reason
        return True

    def status(self) -> ShardStatus:
        failed = self.life.state == ShardState.FAILED
        return ShardStatus(spec=self.spec, state=self.life.wire_state, reason=self.reason,
                           output_tail=[] if failed else None, since=self.since)


class ChildProtocol(protocol.ProcessProtocol):
    """The agent's end of an engine it spawned itself: only the exit status,
    since the engine's output goes to its log file, not to us."""

    def __init__(self):
        self.shard: ShardRunner | None = None
        self.ended: str | None = None

    def processEnded(self, reason):
        value = reason.value
        self.ended = describe_exit(getattr(value, "exitCode", None), getattr(value, "signal", None))
        if self.shard is not None:
            self.shard.leader_exited(self.ended)


class ShardRunner:
    """A shard whose engine was launched or adopted: its lifecycle, carried out on a real process group."""

    def __init__(self, ctx: Context, record: Record, follower: LogFollower, *,
                 child: ChildProtocol | None, life: ShardLifecycle | None = None,
                 rendezvous_port: int | None = None, joined: Joined | None = None,
                 port_taken: Callable[[ShardRunner, str], bool] | None = None, tries: int = 1):
        self.ctx = ctx
        self.record = record
        self.spec = record.spec
        self.identity = ProcessIdentity(record.pid, record.create_time)
        self.follower = follower
        self.adopted = child is None
        self.life = life if life is not None else ShardLifecycle()
        self.reason: str | None = None
        self.output_tail: list[str] | None = None
        # Rank 0 of a multi-node replica: the port its other ranks join at,
        # and HOST:PORT once that port accepts connections.
        self.rendezvous_port = rendezvous_port
        self.rendezvous: str | None = None
        self.joined = joined
        # Asked when the engine exits while starting: True when the port it
        # found taken made the supervisor start it again, on another; this
        # runner is then done, and *tries* counts the launches of this start.
        self._port_taken = port_taken
        self.tries = tries
        self.since = ctx.clock.seconds()
        self._child = child
        self._leader_gone = False
        self._closed = False
        self._killed = False
        self._waiters: list[defer.Deferred] = []
        self._timers: dict[str, object] = {}
        self._watch = self._loop(self._tick)
        checks = record.health or joined is not None or rendezvous_port is not None
        self._health = self._loop(self._probe) if checks else None
        self._stop_watch = self._loop(self._check_stopped)

    # -- what the supervisor asks -------------------------------------------

    @property
    def finished(self) -> bool:
        return self.life.finished

    def status(self) -> ShardStatus:
        return ShardStatus(
            spec=self.spec,
            state=self.life.wire_state,
            pid=self.record.pid,
            endpoint=self.record.endpoint,
            reason=self.reason,
            output_tail=self.output_tail if self.life.state == ShardState.FAILED else None,
            adopted=self.adopted,
            since=self.since,
            rendezvous=self.rendezvous if self.life.state in (ShardState.STARTING, ShardState.READY) else None,
        )

    def begin(self) -> None:
        self._emit()
        self._watch.start(self.ctx.poll_interval, now=True)
        if self._child is not None:
            self._child.shard = self
            if self._child.ended is not None:
                self.leader_exited(self._child.ended)
                return
        if self.life.state != ShardState.STARTING:
            return
        self._later("deadline", self.spec.start_timeout_s, self._timed_out)
        if self._health is not None:
            self._health.start(self.ctx.health_interval, now=True)
        else:
            self._later("worker", self.ctx.poll_interval, self._worker_ran)

    def drain(self) -> bool:
        return self._fire(ShardInput.DRAIN)

    def stop(self) -> defer.Deferred:
        """Fires with the final status once the engine's whole group is gone."""
        if self.finished:
            return defer.succeed(self.status())
        waiter: defer.Deferred = defer.Deferred()
        self._waiters.append(waiter)
        if self.life.stopping:
            return waiter
        self._fire(ShardInput.STOP, f"stopping: SIGTERM sent to process group {self.record.pgid}")
        self.note(f"stopping: SIGTERM to process group {self.record.pgid}")
        signal_group(self.record.pgid, signal.SIGTERM, leader=self.record.pid)
        self._later("escalate", self.ctx.stop_grace_s, self._escalate)
        self._stop_watch.start(min(self.ctx.poll_interval, 0.1), now=True)
        return waiter

    def close(self) -> None:
        """Forget the engine without touching it: what an agent that exits does."""
        self._closed = True
        self._halt()
        if self._child is not None:
            self._child.shard = None

    def note(self, line: str) -> None:
        append_line(self.follower.path, f"llmgw: {line}")
        self.follower.poll()

    def leader_exited(self, how: str | None) -> None:
        if self._closed or self._leader_gone:
            return
        self._leader_gone = True
        self.follower.finish()
        if self.life.stopping:
            self._check_stopped()
            return
        if how is None:
            how = "exited; its exit status went to the agent that started it, not this one"
        starting = self.life.state == ShardState.STARTING
        if starting and self._port_taken is not None and self._port_taken(self, how):
            return
        self._fire(ShardInput.EXITED, how)

    def hand_over(self, why: str) -> None:
        """Let go of an engine that is gone, its shard still starting, for a new launch to carry on: no transition."""
        self.note(why)
        self._closed = True
        self._halt()
        if self._child is not None:
            self._child.shard = None
        for pid in kill_run(self.ctx.files.root, self.record.run):
            log.warn("shard {shard}: killed pid {pid}, left of the engine outside its process group",
                     shard=self.spec.shard_id, pid=pid)
        self.ctx.files.remove(self.ctx.files.record_path(self.spec.shard_id))

    # -- what the clock drives ------------------------------------------------

    def _tick(self) -> None:
        self.follower.poll()
        if self.adopted and not self._leader_gone and not is_alive(self.identity):
            self.leader_exited(None)

    async def _probe(self) -> None:
        """One step of starting: the rendezvous open, then health, then every rank joined; ready after all three."""
        if self.rendezvous_port is not None and self.rendezvous is None:
            if await self.ctx.probe.accepts(self.record.host, self.rendezvous_port):
                self.rendezvous = host_port(self.record.host, self.rendezvous_port)
                if self._live_start():
                    self._emit()
            else:
                return self._waiting(f"waiting for its rendezvous port {self.rendezvous_port} to accept connections")
        if self.record.health:
            url = f"{self.record.endpoint}{self.record.health}"
            if not await self.ctx.probe.ok(url):
                return self._waiting(f"waiting for GET {url} to answer 200")
        if self.joined is not None and self.ctx.joins is not None:
            missing = await self.ctx.joins.missing(self.joined, endpoint=self.record.endpoint, pgid=self.record.pgid)
            if missing is not None:
                return self._waiting(missing)
        if self._live_start():
            self._fire(ShardInput.HEALTHY)

    def _live_start(self) -> bool:
        """Still starting, with its engine still there: what an answer that took a while may act on."""
        return not self._leader_gone and not self._closed and self.life.state == ShardState.STARTING

    def _waiting(self, reason: str) -> None:
        """Say what a starting shard waits for.

        A rank of a multi-node replica tells the control plane each time it
        changes (its rendezvous open, health, then the other ranks); a shard
        on one node waits only for its health, which register reports.
        """
        if self._live_start() and reason != self.reason:
            self.reason = reason
            if self.joined is not None or self.rendezvous_port is not None:
                self._emit()

    def _worker_ran(self) -> None:
        alive = not self._leader_gone and (not self.adopted or is_alive(self.identity))
        if alive:
            self._fire(ShardInput.HEALTHY)

    def _timed_out(self) -> None:
        why = f"did not become healthy within {self.spec.start_timeout_s:g} s"
        if self.reason and (self.joined is not None or self.rendezvous_port is not None):
            why += f"; it was {self.reason}"
        self._fire(ShardInput.TIMED_OUT, why)

    def _escalate(self) -> None:
        self._killed = True
        self.note(f"still running {self.ctx.stop_grace_s:g} s after SIGTERM: SIGKILL to process group {self.record.pgid}")
        signal_group(self.record.pgid, signal.SIGKILL, leader=self.record.pid)
        self._later("survived", self.ctx.kill_wait_s, self._survived)

    def _survived(self) -> None:
        self._fire(ShardInput.SURVIVED_KILL, f"process group {self.record.pgid} still runs {self.ctx.kill_wait_s:g} s after SIGKILL")

    def _check_stopped(self) -> None:
        if not self.life.stopping:
            return
        if not self._leader_gone and (self._child is not None or is_alive(self.identity)):
            return
        if group_alive(self.record.pgid):
            return
        self._leader_gone = True
        self.follower.finish()
        how = f"stopped; SIGKILL after {self.ctx.stop_grace_s:g} s" if self._killed else "stopped"
        self._fire(ShardInput.EXITED, how)

    # -- carrying out a transition -------------------------------------------

    def _fire(self, event: ShardInput, reason: str | None = None) -> bool:
        if self._closed:
            return False
        before = self.life.wire_state
        if self.life.fire(event) is None:
            return False
        state = self.life.state
        self.since = self.ctx.clock.seconds()
        self.reason = reason
        if state != ShardState.STARTING:
            self._cancel("deadline", "worker")
            if self._health is not None and self._health.running:
                self._health.stop()
        if state == ShardState.FAILED:
            self.follower.poll()
            self.output_tail = self.follower.last(self.ctx.failure_tail_lines)
            # Whatever is left of the group goes too: a worker the engine
            # forked can hold GPUs after the engine itself has died.
            signal_group(self.record.pgid, signal.SIGKILL, leader=None if self._leader_gone else self.record.pid)
            self.note(f"failed: {reason}")
        elif state == ShardState.STOPPED:
            self.note(reason or "stopped")
        if self.life.finished:
            self._halt()
            # A group that outlived SIGKILL keeps its record, so the next
            # agent on this node still knows what it is.
            if event is not ShardInput.SURVIVED_KILL:
                for pid in kill_run(self.ctx.files.root, self.record.run):
                    log.warn("shard {shard}: killed pid {pid}, left of the engine outside its process group",
                             shard=self.spec.shard_id, pid=pid)
                self.ctx.files.remove(self.ctx.files.record_path(self.spec.shard_id))
        if self.life.wire_state != before or self.life.finished:
            self._emit()
        if self.life.finished:
            waiters, self._waiters = self._waiters, []
            for waiter in waiters:
                waiter.callback(self.status())
        return True

    def _emit(self) -> None:
        try:
            self.ctx.report(self.status())
        except Exception:
            log.failure("reporting shard {shard} failed", shard=self.spec.shard_id)

    # -- timers ---------------------------------------------------------------

    def _loop(self, fn) -> task.LoopingCall:
        def run():
            try:
                result = fn()
                d = defer.ensureDeferred(result) if inspect.iscoroutine(result) else defer.succeed(None)
            except Exception:
                d = defer.fail()
            # A loop that raised once must keep running: log it and go on.
            d.addErrback(lambda f: log.failure("shard {shard}: {fn}", f, shard=self.spec.shard_id, fn=fn.__name__))
            return d

        loop = task.LoopingCall(run)
        loop.clock = self.ctx.clock
        return loop

    def _later(self, name: str, delay: float, fn) -> None:
        self._cancel(name)
        self._timers[name] = self.ctx.clock.callLater(delay, fn)

    def _cancel(self, *names: str) -> None:
        for name in names:
            call = self._timers.pop(name, None)
            if call is not None and call.active():
                call.cancel()

    def _halt(self) -> None:
        self._cancel(*list(self._timers))
        for loop in (self._watch, self._health, self._stop_watch):
            if loop is not None and loop.running:
                loop.stop()
