"""A router process's session on the hub: it follows the control plane's endpoint table.

`llmgw.process.router` composes `twistd llmgw-router` (the router alone, for
when one process's CPU is the limit) with this session when router.yaml
names a hub.
"""

from __future__ import annotations

from autobahn.twisted.wamp import ApplicationSession
from twisted.logger import Logger

from llmgw.link import uris

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
        await self.subscribe(self.router.apply_table, uris.EVENT_ENDPOINTS)
        table = await self.call(uris.ROUTER_ENDPOINTS)
        self.router.apply_table(table)
        log.info("following the endpoint table: {n} endpoints", n=len(table["endpoints"]))

    def onLeave(self, details):
        # Keep serving the last table while the hub is away: engines do not
        # stop because the control plane restarts.
        log.warn("left the hub ({reason}); serving the last endpoint table", reason=details.reason)
        self.disconnect()
