"""The in-process link between the hub and an autobahn session: how the control plane attaches."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

import txaio
from autobahn.wamp import message
from autobahn.wamp.serializer import JsonSerializer
from autobahn.wamp.types import TransportDetails
from twisted.logger import Logger

from llmgw.wire import JsonText

if TYPE_CHECKING:
    from llmgw.link.peer import HubSession

log = Logger()


class LocalLink:
    """An in-process transport pair between the hub and an autobahn session.

    Messages are delivered in order, each on a later reactor turn, so neither
    side re-enters the other from inside its own message handling.
    """

    def __init__(self, clock, hub_side: HubSession, app_session):
        self._clock = clock
        self._queue: deque = deque()
        self._scheduled = False
        self._open = True
        self.hub_side = hub_side
        self.app_session = app_session
        self._to_hub = LocalEnd(self, lambda m: hub_side.onMessage(m))
        self._to_app = LocalEnd(self, lambda m: app_session.onMessage(_read_texts(m)))

    def open(self) -> None:
        self.hub_side.onOpen(self._to_app)
        self.app_session.onOpen(self._to_hub)

    def post(self, deliver, msg) -> None:
        self._queue.append((deliver, msg))
        if not self._scheduled:
            self._scheduled = True
            self._clock.callLater(0, self._drain)

    def _drain(self) -> None:
        self._scheduled = False
        while self._queue and self._open:
            deliver, msg = self._queue.popleft()
            try:
                deliver(msg)
            except Exception:
                log.failure("in-process link: delivering {msg}", msg=type(msg).__name__)

    def close(self) -> None:
        if not self._open:
            return
        self._open = False
        self.hub_side.onClose(True)
        self.app_session.onClose(True)
        txaio.resolve(self._to_hub.is_closed, None)


def _read_texts(msg):
    """*msg* for a session in this process: an answer's ``JsonText`` read back into the value it holds.

    A remote caller's serializer sends such text as it is; one in process
    would otherwise be handed the text, not the list it asked for.
    """
    if type(msg) is message.Result and (
            any(type(a) is JsonText for a in msg.args or ())
            or any(type(v) is JsonText for v in (msg.kwargs or {}).values())):
        msg.args = [a.value() if type(a) is JsonText else a for a in msg.args or ()] or None
        if msg.kwargs:
            msg.kwargs = {k: v.value() if type(v) is JsonText else v for k, v in msg.kwargs.items()}
    return msg


class LocalEnd:
    _serializer = JsonSerializer()

    def __init__(self, link: LocalLink, deliver):
        self._link = link
        self._deliver = deliver
        self.is_closed = txaio.create_future()
        self.transport_details = TransportDetails(channel_type=TransportDetails.CHANNEL_TYPE_FUNCTION)

    def send(self, msg) -> None:
        self._link.post(self._deliver, msg)

    def isOpen(self) -> bool:
        return self._link._open

    def close(self) -> None:
        self._link.close()

    abort = close
