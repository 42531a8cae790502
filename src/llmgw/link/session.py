"""What every autobahn session llmgw puts on the link shares, local or remote.

autobahn reports a handler whose Deferred was cancelled (the caller
cancelled, or the call timed out and the hub interrupted it) as a user
error, at error level with a traceback, once per cancelled call.  A
cancellation is the caller's decision, not the callee's failure: the hub
logs it in one info line, and the callee says nothing above debug.

Both ends ping a quiet link (autobahn's auto-ping) to find a peer that
lost power, but a peer whose messages keep arriving is not dead: a node's
heartbeat every few seconds already says so.  ``PingWhenQuiet`` sends the
ping only when nothing arrived for a whole interval, so a busy fleet's
links carry their heartbeats and not twice as many ping and pong frames.
"""

from __future__ import annotations

import time

from twisted.internet import defer
from twisted.logger import Logger

log = Logger()


def quiet_cancellations(session):
    """*session*, its ``onUserError`` made to pass over cancelled handlers; other errors are reported as before."""
    loud = session.onUserError

    def onUserError(fail, msg):
        if getattr(fail, "check", None) is not None and fail.check(defer.CancelledError):
            log.debug("{session}: a handler was cancelled by its caller", session=type(session).__name__)
            return
        loud(fail, msg)

    session.onUserError = onUserError
    return session


class PingWhenQuiet:
    """Mixed into an autobahn WebSocket protocol: its auto-ping is skipped while messages arrive.

    ``heard()`` is called for every message; the ping then waits until the
    link has been quiet for ``autoPingInterval``, and times out as before.
    """

    _heard_at = 0.0

    def _now(self) -> float:
        clock = getattr(self.factory, "reactor", None)
        return clock.seconds() if clock is not None else time.monotonic()

    def heard(self) -> None:
        self._heard_at = self._now()

    def _sendAutoPing(self) -> None:
        quiet = self._now() - self._heard_at
        if self.autoPingInterval and quiet < self.autoPingInterval:
            self.autoPingPendingCall = self.factory._batched_timer.call_later(
                self.autoPingInterval - quiet, self._sendAutoPing)
            return
        super()._sendAutoPing()
