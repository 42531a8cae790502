"""A router process's session on the hub: it follows the control plane's endpoint table, and reports its load.

`llmgw.process.router` composes `twistd llmgw-router` (the router alone, for
when one process's CPU is the limit) with this session when router.yaml
names a hub.  While joined, the router's load reports (``loadreport.py``)
go to ``llmgw.cp.router.load``: one call in flight at most; a report made
while one is in flight waits, and a newer one replaces it.
"""

from __future__ import annotations

import attrs
from autobahn.twisted.wamp import ApplicationSession
from twisted.logger import Logger

from llmgw.link import uris
from llmgw.traffic import RouterLoad
from llmgw.views import EndpointTable
from llmgw.wire import WireError, from_wire, to_wire

log = Logger()


class TableSession(ApplicationSession):
    """Follows the control plane's endpoint table over the hub."""

    def __init__(self, config, router):
        super().__init__(config)
        self.router = router
        self._sending = False
        self._next: RouterLoad | None = None
        self._failing = False

    def onConnect(self):
        self.join(self.config.realm)

    async def onJoin(self, details):
        # Subscribe first, then ask: a change between the two is not missed.
        await self.subscribe(self.follow, uris.EVENT_ENDPOINTS)
        table = self.follow(await self.call(uris.ROUTER_ENDPOINTS))
        if table is not None:
            log.info("following the endpoint table: {n} endpoints", n=len(table.endpoints))
        self.router.load_sink = self.send_load

    def send_load(self, report: RouterLoad) -> None:
        """Call ``llmgw.cp.router.load`` with *report*, or keep it for when the call in flight is done."""
        if self._sending:
            if self._next is not None and self._next.urgent and not report.urgent:
                report = attrs.evolve(report, urgent=True)
            self._next = report
            return
        self._sending = True
        try:
            d = self.call(uris.ROUTER_LOAD, to_wire(report))
        except Exception as e:  # a report that does not fit the wire, or a session already gone
            self._sent(e)
            return
        d.addCallbacks(lambda _: self._sent(None), lambda f: self._sent(f.value))

    def _sent(self, error: BaseException | None) -> None:
        self._sending = False
        if error is None:
            if self._failing:
                log.info("load reports reach the control plane again")
            self._failing = False
        elif not self._failing:
            self._failing = True
            log.warn("the control plane did not take this router's load report ({e}); "
                     "the next ones are sent, and this is logged again once one goes", e=str(error) or repr(error))
        report, self._next = self._next, None
        if report is not None:
            self.send_load(report)

    def follow(self, payload) -> EndpointTable | None:
        """A table from the hub; one that does not fit is refused and the last one keeps serving."""
        try:
            table = from_wire(EndpointTable, payload)
        except WireError as e:
            log.error("endpoint table refused, the previous one stays: {e}", e=str(e))
            return None
        self.router.apply_table(table)
        return table

    def onLeave(self, details):
        # Keep serving the last table while the hub is away: engines do not
        # stop because the control plane restarts.
        log.warn("left the hub ({reason}); serving the last endpoint table", reason=details.reason)
        if self.router.load_sink == self.send_load:
            self.router.load_sink = None
        self.disconnect()
