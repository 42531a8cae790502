"""What every autobahn session llmgw puts on the link shares, local or remote.

autobahn reports a handler whose Deferred was cancelled (the caller
cancelled, or the call timed out and the hub interrupted it) as a user
error, at error level with a traceback, once per cancelled call.  A
cancellation is the caller's decision, not the callee's failure: the hub
logs it in one info line, and the callee says nothing above debug.
"""

from __future__ import annotations

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
