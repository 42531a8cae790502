"""Who leads: a campaign for ``/llmgw/leader`` under a lease, its renewals, and the deadline that fences a leader.

``Election(clock, client, name, url, lease_s, margin_s=1.0)`` campaigns by
creating the key under a lease of ``lease_s`` seconds (``EtcdClient.claim``:
only if no one holds it).  The winner's **epoch** is the key's
``create_revision``: etcd makes it grow with each new leader.  The value is
``{"name": ..., "url": ...}``; the epoch is read from the key itself (a value
cannot hold the revision it is written at).

- *campaigning*: asking etcd for a lease and the key; a failed request is
  asked again every ``lease_s / 3``.
- *standby*: another server holds the key; ``leader`` names it.  The key is
  watched and read every ``lease_s / 3``: once it is gone, campaign.
- *leading*: the lease is renewed every ``lease_s / 3``.  ``can_command(now)``
  is true only before the **deadline**: the time the last successful renewal
  was *sent*, plus ``lease_s``, less ``margin_s``.  etcd cannot have let the
  lease go before then, so no other server can lead yet; a leader that was
  stopped (SIGSTOP), or cut off from etcd, refuses to command from its
  deadline on, before it has noticed anything.  At the deadline without a
  renewal it steps down (listeners told), revokes its lease if etcd still
  answers, and campaigns again; so it does when etcd says the lease or the
  key is gone.
- *stepping down*: ``stop()`` revokes the lease, so a standby takes over at
  once rather than after ``lease_s``.

When etcd itself is lost, every server loses with it: the leader cannot
renew, steps down at its deadline, and none can lead until etcd answers
again — the fleet keeps running what it runs, and no server commands it.
That is the choice: never two leaders, at the price of none while etcd is
down.  ``listeners`` are called with the election on every change of
``leading``, ``epoch`` or ``leader``.
"""

from __future__ import annotations

import enum
import json
from typing import Callable

import attrs
from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure

from llmgw.ha.etcd import EtcdError, KeyValue
from llmgw.ha.watch import WatchEvent, WatchKind
from llmgw.text import printable

log = Logger()

LEADER_KEY = b"/llmgw/leader"
MAX_LEADER_VALUE = 4096
MAX_WORDS = 256


@attrs.frozen
class Leader:
    """The server etcd names as leading: its name, its hub URL (``ha.advertise``), its epoch."""

    name: str
    url: str
    epoch: int


def leader_of(kv: KeyValue | None) -> Leader | None:
    """The ``Leader`` the key names; None when there is none, or its value is not one llmgw writes."""
    if kv is None or not kv.create_revision or len(kv.value) > MAX_LEADER_VALUE:
        return None
    try:
        value = json.loads(kv.value)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    name, url = value.get("name"), value.get("url")
    if not isinstance(name, str) or not isinstance(url, str):
        return None
    return Leader(printable(name)[:MAX_WORDS], printable(url)[:MAX_WORDS], kv.create_revision)


class ElectionState(enum.Enum):
    STOPPED = "stopped"
    CAMPAIGNING = "campaigning"
    STANDBY = "standby"
    LEADING = "leading"
    STEPPING_DOWN = "stepping down"


class ElectionInput(enum.Enum):
    START = "start"
    WON = "won"  # the key was created under our lease
    LOST = "lost"  # another holds it
    VACANT = "vacant"  # the key is gone (watched, or read)
    LAPSED = "lapsed"  # the deadline passed unrenewed, or etcd says the lease or the key is gone
    STOP = "stop"
    RELEASED = "released"  # the lease is revoked, or could not be


class Election:
    """This server's part in the election; see the module's text."""

    def __init__(self, clock, client, name: str, url: str, lease_s: float, margin_s: float = 1.0):
        if not 0 <= margin_s < lease_s:
            raise ValueError(f"the margin ({margin_s:g} s) must be less than the lease ({lease_s:g} s)")
        self.clock, self.client = clock, client
        self.name, self.url = name, url
        self.lease_s, self.margin_s = lease_s, margin_s
        self.interval = lease_s / 3
        self.state = ElectionState.STOPPED
        self.leading = False
        self.epoch: int | None = None
        self.leader: Leader | None = None
        self.listeners: list[Callable[[Election], object]] = []
        self.lease: int | None = None
        self.renewed_at: float | None = None  # when the last renewal that etcd took was sent
        self._tick_call = None
        self._deadline_call = None
        self._watch = None
        self._busy = self._again = False

    # -- what the server reads --

    def deadline(self) -> float | None:
        if self.renewed_at is None:
            return None
        return self.renewed_at + self.lease_s - self.margin_s

    def can_command(self, now: float) -> bool:
        """Whether this server may command the fleet at *now*: it leads, and its lease cannot have lapsed."""
        deadline = self.deadline()
        return self.leading and deadline is not None and now < deadline

    # -- the machine --

    def feed(self, given: ElectionInput) -> bool:
        after = TABLE.get((self.state, given))
        if after is None:
            return False
        self.state = after
        return True

    def start(self) -> None:
        if self.feed(ElectionInput.START):
            self._watch = self.client.watch(LEADER_KEY, self._watched)
            self._schedule(0)

    def stop(self) -> defer.Deferred[None]:
        """Step down (if leading) and stop: the lease is revoked, so a standby need not wait for it."""
        return defer.Deferred.fromCoroutine(self._stop())

    async def _stop(self) -> None:
        if not self.feed(ElectionInput.STOP):
            return
        for call in (self._tick_call, self._deadline_call):
            if call is not None and call.active():
                call.cancel()
        if self._watch is not None:
            self._watch.stop()
        was_leading = self.leading
        self._set(leading=False, epoch=None)
        if self.lease is not None:
            lease, self.lease = self.lease, None
            try:
                await self.client.revoke(lease)
            except EtcdError as e:
                log.warn("could not revoke lease {lease} while stopping: {why}; it lapses in {s:g} s",
                         lease=lease, why=str(e), s=self.lease_s)
        if was_leading:
            log.info("{name} stepped down: the server is stopping", name=self.name)
        self.feed(ElectionInput.RELEASED)

    def _schedule(self, delay: float) -> None:
        if self._tick_call is not None and self._tick_call.active():
            self._tick_call.cancel()
        self._tick_call = self.clock.callLater(delay, self._tick)

    def _tick(self) -> None:
        if self._busy:
            self._again = True  # asked for while a step was in flight: step again once it ends
            return
        self._busy, self._again = True, False
        defer.Deferred.fromCoroutine(self._step()).addBoth(self._stepped)

    def _stepped(self, result) -> None:
        self._busy = False
        if isinstance(result, Failure):
            log.failure("the election's step failed", result)
        if self.state in (ElectionState.CAMPAIGNING, ElectionState.STANDBY, ElectionState.LEADING):
            if self._again:
                self._schedule(0)
            elif self._tick_call is None or not self._tick_call.active():
                self._schedule(self.interval)

    async def _step(self) -> None:
        try:
            if self.state is ElectionState.CAMPAIGNING:
                await self._campaign()
            elif self.state is ElectionState.STANDBY:
                self._read(await self.client.get(LEADER_KEY))
            elif self.state is ElectionState.LEADING:
                await self._renew()
        except EtcdError as e:
            self._failed(e)

    def _failed(self, error: EtcdError) -> None:
        if self.state is ElectionState.LEADING:
            deadline = self.deadline()
            if deadline is not None and self.clock.seconds() >= deadline:
                self._lapse(f"no renewal by its deadline: {error}")
            else:
                log.warn("{name} could not renew its lease ({why}); it leads until {s:.1f} s from now unless it does",
                         name=self.name, why=str(error), s=(deadline or 0) - self.clock.seconds())
        else:
            log.warn("{name} could not reach etcd while {state}: {why}", name=self.name,
                     state=self.state.value, why=str(error))

    async def _campaign(self) -> None:
        if self.lease is None:
            sent = self.clock.seconds()
            self.lease = await self.client.grant(max(1, round(self.lease_s)))
            self.renewed_at = sent
        value = json.dumps({"name": self.name, "url": self.url}).encode()
        won, kv = await self.client.claim(LEADER_KEY, value, self.lease)
        if self.state is not ElectionState.CAMPAIGNING:
            return  # stopped meanwhile
        # A claim retried after a timeout may find the key put by its first try: ours all the same.
        if (won or (kv is not None and kv.lease == self.lease)) and kv is not None:
            self.feed(ElectionInput.WON)
            self._set(leading=True, epoch=kv.create_revision, leader=Leader(self.name, self.url, kv.create_revision))
            self._arm_deadline()
            log.info("{name} leads, epoch {epoch}", name=self.name, epoch=kv.create_revision)
            return
        lease, self.lease, self.renewed_at = self.lease, None, None
        self.client.revoke(lease).addErrback(lambda _: None)  # else it lapses by itself
        self.feed(ElectionInput.LOST)
        self._read(kv)
        if self.leader is not None:
            log.info("{name} stands by; {leader} leads, epoch {epoch}", name=self.name,
                     leader=self.leader.name, epoch=self.leader.epoch)

    async def _renew(self) -> None:
        assert self.lease is not None
        sent = self.clock.seconds()
        ttl = await self.client.keepalive(self.lease)
        if self.state is not ElectionState.LEADING:
            return
        if ttl <= 0:
            self._lapse("etcd no longer has its lease")
            return
        self.renewed_at = max(self.renewed_at or sent, sent)
        self._arm_deadline()

    def _arm_deadline(self) -> None:
        if self._deadline_call is not None and self._deadline_call.active():
            self._deadline_call.cancel()
        deadline = self.deadline()
        assert deadline is not None
        self._deadline_call = self.clock.callLater(max(0.0, deadline - self.clock.seconds()), self._deadline_due)

    def _deadline_due(self) -> None:
        deadline = self.deadline()
        if self.state is ElectionState.LEADING and deadline is not None and self.clock.seconds() >= deadline:
            self._lapse(f"no renewal of its lease within {self.lease_s - self.margin_s:g} s")

    def _lapse(self, why: str) -> None:
        if not self.feed(ElectionInput.LAPSED):
            return
        log.warn("{name} stepped down from epoch {epoch}: {why}", name=self.name, epoch=self.epoch, why=why)
        if self._deadline_call is not None and self._deadline_call.active():
            self._deadline_call.cancel()
        if self.lease is not None:
            lease, self.lease = self.lease, None
            self.client.revoke(lease).addErrback(lambda _: None)  # so a standby need not wait, if etcd hears it
        self.renewed_at = None
        self._set(leading=False, epoch=None, leader=None)
        self._schedule(0)

    def _read(self, kv: KeyValue | None) -> None:
        """What the key says now, seen while standing by (or after losing)."""
        self._set(leader=leader_of(kv))
        if kv is None and self.feed(ElectionInput.VACANT):
            self._schedule(0)

    def _watched(self, events: list[WatchEvent]) -> None:
        for event in events:
            if event.kind is WatchKind.DELETE:
                if self.state is ElectionState.LEADING:
                    self._lapse("its key was deleted")
                else:
                    self._read(None)
            elif self.state is ElectionState.LEADING:
                if event.kv.create_revision != self.epoch:
                    self._lapse(f"the key was created again (epoch {event.kv.create_revision})")
            elif self.state is ElectionState.STANDBY:
                self._read(event.kv)

    def _set(self, **changes) -> None:
        before = (self.leading, self.epoch, self.leader)
        for name, value in changes.items():
            setattr(self, name, value)
        if (self.leading, self.epoch, self.leader) != before:
            for listener in list(self.listeners):
                try:
                    listener(self)
                except Exception:
                    log.failure("an election listener failed")


_S, _I = ElectionState, ElectionInput
TABLE: dict[tuple[ElectionState, ElectionInput], ElectionState] = {
    (_S.STOPPED, _I.START): _S.CAMPAIGNING,
    (_S.CAMPAIGNING, _I.WON): _S.LEADING,
    (_S.CAMPAIGNING, _I.LOST): _S.STANDBY,
    (_S.STANDBY, _I.VACANT): _S.CAMPAIGNING,
    # Fenced the moment it lapses; it stands again, with a new lease, as any server would.
    (_S.LEADING, _I.LAPSED): _S.CAMPAIGNING,
    (_S.CAMPAIGNING, _I.STOP): _S.STEPPING_DOWN,
    (_S.STANDBY, _I.STOP): _S.STEPPING_DOWN,
    (_S.LEADING, _I.STOP): _S.STEPPING_DOWN,
    (_S.STEPPING_DOWN, _I.RELEASED): _S.STOPPED,
}
