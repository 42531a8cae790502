"""The control session's elastic procedures: routers' traffic in (``llmgw.cp.router.load``), ``ctl scale``.

Each router reports its traffic every second; the server's own router hands
its report to ``deliver`` in-process, a router worker calls
``llmgw.cp.router.load``.  A report is held under the key the hub gives its
caller (certificate name and session), so a router cannot speak for
another, and only a router certificate may send one.  A report marked
urgent (a request is held for a model with no replica) runs a reconcile
pass at once rather than at the next second, so a cold start does not wait
for the clock.
"""

from __future__ import annotations

from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import RegisterOptions
from twisted.logger import Logger

from llmgw.answers import ScaleAnswer
from llmgw.control.demand import TooManyRouters
from llmgw.control.elastic import scale_of
from llmgw.control.slot import SlotState
from llmgw.link import uris
from llmgw.roles import ROLE_ROUTER
from llmgw.traffic import RouterLoad
from llmgw.views import EventKind
from llmgw.wire import WireError, from_wire, to_wire

log = Logger()


class Scaling:
    """Registered on the control session as one of its ``extensions``."""

    def __init__(self, session):
        self.session = session
        self._soon = None
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
        for listener in self.session.load_listeners:
            try:
                listener(report, key, now)
            except TooManyRouters as e:
                raise ApplicationError(uris.ERROR_REFUSED, str(e)) from None
            except Exception:
                log.failure("a traffic report listener failed")
        if report.urgent and self._soon is None:
            self._soon = self.session._clock.callLater(0, self._pass)

    def _shard_changed(self, kind, ident, event) -> None:
        """A shard of a replica being stopped to make room has gone: place what waits for the room now."""
        if kind is EventKind.SHARD and self.session.reconciler.elastic.room and self._soon is None:
            self._soon = self.session._clock.callLater(0, self._pass)

    def _demand(self, report: RouterLoad, key: str, now: float) -> None:
        self.session.reconciler.elastic.demand.report(report, key, now)

    def _pass(self) -> None:
        """A cold start's pass: place what the demand wakes, and tell the routers."""
        self._soon = None
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
        policy = scale_of(entry)
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
        if self._soon is None:
            self._soon = self.session._clock.callLater(0, self._pass)
        return to_wire(ScaleAnswer(model=model, min=policy.min, max=policy.max, target=target,
                                   pinned=count is not None, ready=ready, words=words))
