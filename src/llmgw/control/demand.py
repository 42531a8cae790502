"""What the routers say of their traffic, summed: the demand elastic replicas are scaled on.

Each router reports a ``llmgw.traffic.RouterLoad`` every second; ``Demand``
keeps the latest of each (by the key the control plane gives the router:
its certificate's name and its session, never a name the report chose) for
``REPORT_LIFETIME_S``, and sums them per model and per endpoint.  A router
that stops reporting — it exited, or its link dropped — is forgotten then,
and with it what it had in flight: its clients are gone with it.

A replica being drained is stopped once every router has reported, after
the drain began, that it has nothing left on it (``drained``): a report
received before the routers had the table without it may still show a
request about to be sent there.

A report is kept as it comes and the sums are made when next read, so a
flood of reports costs each its own size, not every router's again.
"""

from __future__ import annotations

import attrs

from llmgw.traffic import REPORT_INTERVAL_S, REPORT_LIFETIME_S, RouterLoad

#: Routers whose reports are kept at once; one past this is refused until one lapses.
MAX_ROUTERS = 1024
#: Sessions of one router certificate (its workers on one host) whose reports are kept at once.
MAX_PER_CERTIFICATE = 64


@attrs.define
class ModelDemand:
    """One model's traffic across every router, now."""

    inflight: int = 0
    queued: int = 0
    held: int = 0
    # The engines' own waiting queues, where any router's engines say; None: no engine says.
    engine_waiting: int | None = None
    # When the last request for it arrived at any router (control plane's clock); None: none heard of.
    last_request_at: float | None = None

    @property
    def busy(self) -> int:
        """Requests the model is serving or that wait for it, everywhere."""
        return self.inflight + self.queued + self.held + (self.engine_waiting or 0)

    @property
    def waiting(self) -> int:
        """Requests that wait for a replica: held for a cold start, or queued for a slot."""
        return self.queued + self.held


class TooManyRouters(Exception):
    """More routers report than ``MAX_ROUTERS``."""


class Demand:
    def __init__(self):
        self._reports: dict[str, tuple[RouterLoad, float]] = {}
        # The newest request each model has seen, kept past its router's report.
        self._last_request: dict[str, float] = {}
        self._models: dict[str, ModelDemand] = {}
        self._endpoints: dict[str, int] = {}
        self._stale = False  # a report came or went since the sums were made

    def report(self, load: RouterLoad, router: str, now: float) -> None:
        """Take *router*'s newest report, received at *now*."""
        if router not in self._reports:
            if len(self._reports) >= MAX_ROUTERS:
                self.expire(now)
            if len(self._reports) >= MAX_ROUTERS:
                raise TooManyRouters(f"{MAX_ROUTERS} routers already report; this one's report is not kept")
            name = router.partition("#")[0]
            if sum(1 for r in self._reports if r.partition("#")[0] == name) >= MAX_PER_CERTIFICATE:
                self.expire(now)
                if sum(1 for r in self._reports if r.partition("#")[0] == name) >= MAX_PER_CERTIFICATE:
                    raise TooManyRouters(f"{MAX_PER_CERTIFICATE} sessions of router {name} already report; a "
                                         "certificate is one router's (give each worker host its own)")
        self._reports[router] = (load, now)
        for model in load.models:
            if model.idle_s is not None:
                at = now - model.idle_s
                if at > self._last_request.get(model.model, float("-inf")):
                    self._last_request[model.model] = at
        self._stale = True

    def expire(self, now: float) -> None:
        """Forget the routers that have not reported for ``REPORT_LIFETIME_S``."""
        old = [r for r, (_, at) in self._reports.items() if now - at > REPORT_LIFETIME_S]
        for router in old:
            del self._reports[router]
        if old:
            self._stale = True

    def forget(self, models: set[str]) -> None:
        """Drop what is kept of models no longer in the catalog."""
        gone = [m for m in self._last_request if m not in models]
        for name in gone:
            del self._last_request[name]
        if gone:
            self._stale = True

    @property
    def models(self) -> dict[str, ModelDemand]:
        """Each model's traffic, summed over every router's latest report."""
        if self._stale:
            self._sum()
        return self._models

    def _sum(self) -> None:
        self._stale = False
        models: dict[str, ModelDemand] = {}
        endpoints: dict[str, int] = {}
        for load, _ in self._reports.values():
            for m in load.models:
                d = models.setdefault(m.model, ModelDemand())
                d.inflight += m.inflight
                d.queued += m.queued
                d.held += m.held
                if m.engine_waiting is not None:
                    d.engine_waiting = (d.engine_waiting or 0) + m.engine_waiting
            for e in load.endpoints:
                endpoints[e.id] = endpoints.get(e.id, 0) + e.inflight
        for name, at in self._last_request.items():
            models.setdefault(name, ModelDemand()).last_request_at = at
        self._models = models
        self._endpoints = endpoints

    def model(self, name: str) -> ModelDemand:
        return self.models.get(name) or ModelDemand(last_request_at=self._last_request.get(name))

    def inflight(self, replica_id: str) -> int:
        """Requests on the replica's endpoint, in every router that reports."""
        if self._stale:
            self._sum()
        return self._endpoints.get(replica_id, 0)

    def drained(self, replica_id: str, since: float) -> bool:
        """Whether every router reporting has said, since *since*, that it has nothing left on the replica.

        A router lists every endpoint of its table and every one it still has
        requests on: a report made after *since* that does not list the
        replica comes from a router that has the table without it and nothing
        on it (routers report at once when an endpoint leaves their table).  A
        report that lists it with none in flight counts only a full interval
        after *since*: that router may not have had the new table yet.
        """
        for load, at in self._reports.values():
            if at <= since:
                return False
            for endpoint in load.endpoints:
                if endpoint.id == replica_id and (endpoint.inflight or at < since + REPORT_INTERVAL_S):
                    return False
        return True

    def __len__(self) -> int:
        return len(self._reports)
