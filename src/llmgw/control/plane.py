"""The control plane's session on the hub: agents' reports in, operators' queries out.

Who is calling comes from the call details the hub fills in from the
caller's certificate — never from the payload.  A payload that does not fit
its record is refused with the field that is wrong, and changes nothing.
"""

from __future__ import annotations

import attrs
from autobahn.twisted.wamp import ApplicationSession
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import RegisterOptions, SubscribeOptions
from twisted.logger import Logger

from llmgw.control.fleet import Fleet, NotRegistered
from llmgw.link import hub as hubmod
from llmgw.link import uris
from llmgw.records import Heartbeat, Inventory
from llmgw.wire import WireError, from_wire

log = Logger()


class ControlSession(ApplicationSession):
    def __init__(self, config, fleet_factory):
        super().__init__(config)
        # The fleet emits through this session, so it is built once we can publish.
        self.fleet: Fleet = fleet_factory(self._emit)

    def onConnect(self):
        self.join(self.config.realm)

    async def onJoin(self, details):
        with_details = RegisterOptions(details_arg="details")
        await self.register(self.agent_register, uris.AGENT_REGISTER, with_details)
        await self.register(self.agent_heartbeat, uris.AGENT_HEARTBEAT, with_details)
        await self.register(self.nodes, uris.CP_NODES)
        await self.subscribe(self._session_left, hubmod.META_ON_LEAVE, SubscribeOptions())
        log.info("control plane attached to the hub")

    def _emit(self, kind: str, ident: str, event: dict) -> None:
        if self.is_attached():
            self.publish(uris.EVENT_PREFIX + kind, ident, event)

    @staticmethod
    def _node_caller(details) -> str:
        if details.caller_authrole != uris.ROLE_NODE:
            raise ApplicationError(uris.ERROR_NOT_AUTHORIZED, f"{details.caller_authid} is not a node")
        return details.caller_authid

    @staticmethod
    def _decode(cls, payload):
        try:
            return from_wire(cls, payload)
        except WireError as e:
            raise ApplicationError(uris.ERROR_INVALID_ARGUMENT, str(e)) from None

    def agent_register(self, inventory, details=None):
        node_id = self._node_caller(details)
        inv = self._decode(Inventory, inventory)
        if inv.node_id != node_id:
            log.warn(
                "node {id} registered an inventory naming {other}; its certificate wins",
                id=node_id, other=inv.node_id,
            )
            inv = attrs.evolve(inv, node_id=node_id)
        self.fleet.register(node_id, details.caller, inv)
        return {"node_id": node_id}

    def agent_heartbeat(self, beat, details=None):
        node_id = self._node_caller(details)
        try:
            self.fleet.heartbeat(node_id, details.caller, self._decode(Heartbeat, beat))
        except NotRegistered:
            raise ApplicationError(uris.ERROR_NOT_REGISTERED, f"{node_id} must register first") from None

    def nodes(self):
        return self.fleet.views()

    def _session_left(self, info):
        if info.get("authrole") == uris.ROLE_NODE:
            self.fleet.link_closed(info["session"])
