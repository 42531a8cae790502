"""The control session's elastic procedures: routers' traffic in (``llmgw.cp.router.load``), ``ctl scale``.

Each router reports its traffic every second; the server's own router hands
its report to ``deliver`` in-process, a router worker calls
``llmgw.cp.router.load``.  A report is held under the key the hub gives its
caller (certificate name and session), so a router cannot speak for
another, and only a router certificate may send one.  A report marked
urgent (a request is held for a model with no replica) runs a reconcile
pass at once rather than at the next second, so a cold start does not wait
for the clock.

What a report says is a router's claim, held to the catalog before any
listener sees it (``within_catalog``): a model the catalog does not have, an
endpoint that is not one of its replicas, more requests held than the
model's ``max_held`` (none for a model that does not start on demand) are
left out or cut down, so one router cannot wake every model nor keep what
it invents.  The passes reports and shard events ask for run at most one per
``PASS_GAP_S``: a flood of urgent reports costs a pass a gap, not one each.
"""

from __future__ import annotations

from typing import Mapping

import attrs
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import RegisterOptions
from twisted.logger import Logger

from llmgw.answers import ScaleAnswer
from llmgw.control.catalog import Entry
from llmgw.control.demand import TooManyRouters
from llmgw.control.slot import SlotState, split_slot_id
from llmgw.link import uris
from llmgw.roles import ROLE_ROUTER
from llmgw.traffic import RouterLoad
from llmgw.views import EventKind
from llmgw.wire import WireError, from_wire, to_wire

log = Logger()

#: The least time between two passes a report or a shard's event asks for; the first runs at once.
PASS_GAP_S = 0.1


def within_catalog(report: RouterLoad, catalog: Mapping[str, Entry]) -> RouterLoad:
    """*report* less what no router of this catalog can have; itself when all of it may be so.

    Models and counts of models not in the catalog, endpoints that are not
    one of its replicas' ids, and requests held past the model's
    ``max_held`` (a router holds none for a model with ``min`` above 0)
    go, and a model named twice counts once.
    """
    models = []
    seen: set[str] = set()
    for m in report.models:
        entry = catalog.get(m.model)
        if entry is None or m.model in seen:  # a model named twice would count twice
            continue
        seen.add(m.model)
        scale = entry.model.scale
        most = scale.max_held if scale.elastic and scale.min == 0 else 0
        models.append(m if m.held <= most else attrs.evolve(m, held=most))
    endpoints = [e for e in report.endpoints if _a_replica(e.id, catalog)]
    counts = [c for c in report.counts if c.model in catalog]
    if (len(models) == len(report.models) and len(endpoints) == len(report.endpoints)
            and len(counts) == len(report.counts) and all(a is b for a, b in zip(models, report.models))):
        return report
    return attrs.evolve(report, models=models, endpoints=endpoints, counts=counts)


def _a_replica(ident: str, catalog: Mapping[str, Entry]) -> bool:
    model, index = split_slot_id(ident)
    entry = catalog.get(model)
    return entry is not None and index is not None and 0 <= index < entry.model.replicas


class Scaling:
    """Registered on the control session as one of its ``extensions``."""

    def __init__(self, session):
        self.session = session
        self._soon = None
        self._last_pass: float | None = None
        self._refused: set[str] = set()
        session.load_listeners.append(self._demand)
        session.event_listeners.append(self._shard_changed)

    async def register(self, session) -> None:
        await session.register(self.router_load, uris.ROUTER_LOAD, RegisterOptions(details_arg="details"))
        await session.register(self.scale, uris.CP_SCALE)

    # -- routers' traffic --

    def router_load(self, payload, details=None) -> None:
        if details is None or details.caller_authrole != ROLE_ROUTER:
            who = getattr(details, "caller_authid", None)
            raise ApplicationError(uris.ERROR_NOT_AUTHORIZED, f"{who} is not a router: only routers report traffic")
        key = f"{details.caller_authid}#{details.caller}"
        try:
            report = from_wire(RouterLoad, payload)
        except WireError as e:
            if key not in self._refused and len(self._refused) < 1024:
                self._refused.add(key)
                log.warn("refused a traffic report from router {who}: {why}", who=details.caller_authid, why=str(e))
            raise ApplicationError(uris.ERROR_INVALID_ARGUMENT, str(e)) from None
        self._refused.discard(key)
        self.deliver(report, key)

    def deliver(self, report: RouterLoad, key: str) -> None:
        """A router's report, from the hub or from the server's own router."""
        now = self.session._clock.seconds()
        catalog = self.session.catalog.entries if self.session.catalog is not None else {}
        report = within_catalog(report, catalog)
        for listener in self.session.load_listeners:
            try:
                listener(report, key, now)
            except TooManyRouters as e:
                raise ApplicationError(uris.ERROR_REFUSED, str(e)) from None
            except Exception:
                log.failure("a traffic report listener failed")
        if report.urgent:
            self._pass_soon()

    def _shard_changed(self, kind, ident, event) -> None:
        """A shard of a replica being stopped to make room has gone: place what waits for the room now."""
        if kind is EventKind.SHARD and self.session.reconciler.elastic.room:
            self._pass_soon()

    def _demand(self, report: RouterLoad, key: str, now: float) -> None:
        self.session.reconciler.elastic.demand.report(report, key, now)

    def _pass_soon(self) -> None:
        """A pass at once, or ``PASS_GAP_S`` after the last one; one only, however many ask meanwhile."""
        if self._soon is not None:
            return
        clock = self.session._clock
        wait = 0.0 if self._last_pass is None else max(0.0, self._last_pass + PASS_GAP_S - clock.seconds())
        self._soon = clock.callLater(wait, self._pass)

    def _pass(self) -> None:
        """A cold start's pass: place what the demand wakes, and tell the routers."""
        self._soon = None
        self._last_pass = self.session._clock.seconds()
        session = self.session
        if session.is_attached():
            session.reconciler.tick()
            session.publish_endpoints()

    # -- ctl scale --

    def scale(self, model, count=None) -> dict:
        """Pin *model* at *count* replicas until the next reload; *count* None gives it back to its policy."""
        catalog = self.session.catalog.entries if self.session.catalog is not None else {}
        if not isinstance(model, str) or model not in catalog:
            served = ", ".join(sorted(catalog)) or "none"
            raise ApplicationError(uris.ERROR_INVALID_ARGUMENT,
                                   f"no model named {model!r} is in the catalog; models: {served}")
        if count is not None and (isinstance(count, bool) or not isinstance(count, int)):
            raise ApplicationError(uris.ERROR_INVALID_ARGUMENT, f"the count is a whole number, not {count!r}")
        entry = catalog[model]
        policy = entry.model.scale
        if not policy.elastic:
            raise ApplicationError(uris.ERROR_REFUSED, (
                f"{model} runs a fixed {entry.model.replicas} replica(s) (replicas: {entry.model.replicas} in "
                "server.yaml); give it replicas: {min: M, max: X} to scale it"))
        reconciler = self.session.reconciler
        now = self.session._clock.seconds()
        try:
            target = reconciler.elastic.scaler.pin(model, count, policy, now)
        except ValueError as e:
            raise ApplicationError(uris.ERROR_INVALID_ARGUMENT, str(e)) from None
        log.info("ctl scale: {model} {what}", model=model,
                 what=f"pinned at {count}" if count is not None else "back to its policy")
        ready = sum(1 for slot_id, slot in reconciler.slots.items()
                    if slot_id.rpartition("/")[0] == model and slot.state is SlotState.READY)
        words = (f"pinned at {target} until the next reload or `llmgw ctl scale {model} --auto`"
                 if count is not None else f"scaled by its policy again, now {target}")
        self._pass_soon()
        return to_wire(ScaleAnswer(model=model, min=policy.min, max=policy.max, target=target,
                                   pinned=count is not None, ready=ready, words=words))
