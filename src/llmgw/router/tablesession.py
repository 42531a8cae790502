"""A router process's session on the hub: it follows the control plane's endpoint table.

`llmgw.process.router` composes `twistd llmgw-router` (the router alone, for
when one process's CPU is the limit) with this session when router.yaml
names a hub.
"""

from __future__ import annotations

from autobahn.twisted.wamp import ApplicationSession
from twisted.logger import Logger

from llmgw.link import uris
from llmgw.views import EndpointTable
from llmgw.wire import WireError, from_wire

log = Logger()


class TableSession(ApplicationSession):
    """Follows the control plane's endpoint table over the hub."""

    def __init__(self, config, router):
        super().__init__(config)
        self.router = router

    def onConnect(self):
        self.join(self.config.realm)

    async def onJoin(self, details):
        # Subscribe first, then ask: a change between the two is not missed.
        await self.subscribe(self.follow, uris.EVENT_ENDPOINTS)
        table = self.follow(await self.call(uris.ROUTER_ENDPOINTS))
        if table is not None:
            log.info("following the endpoint table: {n} endpoints", n=len(table.endpoints))

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
        self.disconnect()
