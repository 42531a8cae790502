"""The dealer on its own hub, with in-process sessions: what becomes of calls and registrations when a session leaves."""

from __future__ import annotations

import pytest
import pytest_twisted
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import ComponentConfig
from twisted.internet import defer, reactor

from llmgw.link import uris
from llmgw.link.hub import Hub
from tests.link.conftest import Joined
from tests.support.wait import until

SLOW = uris.CP_AGENT + "slow"


async def _attach(hub: Hub, authid: str) -> Joined:
    session = Joined(ComponentConfig(realm=uris.REALM))
    hub.attach_local(session, authid=authid)
    return await session.ready.addTimeout(5, reactor)


async def _slow_callee(hub: Hub, authid: str) -> tuple[Joined, list[defer.Deferred]]:
    callee = await _attach(hub, authid)
    pending: list[defer.Deferred] = []
    await callee.register(lambda: pending.append(defer.Deferred()) or pending[-1], SLOW)
    return callee, pending


@pytest_twisted.ensureDeferred
async def test_a_caller_that_leaves_has_its_call_interrupted_at_a_callee_that_cancels():
    hub = Hub(reactor)
    callee, pending = await _slow_callee(hub, "control")
    caller = await _attach(hub, "operator-console")
    caller.call(SLOW).addErrback(lambda failure: None)
    await until(lambda: pending, "the callee to be invoked")
    caller.leave()
    # autobahn cancels the handler's Deferred when INTERRUPT arrives.
    await until(lambda: pending[0].called, "the callee's handler to be cancelled")
    assert not hub.dealer.invocations
    callee.leave()


@pytest_twisted.ensureDeferred
async def test_a_procedure_whose_callee_left_is_free_for_the_next():
    hub = Hub(reactor)
    first, pending = await _slow_callee(hub, "control")
    holder = hub.dealer.callee(SLOW)
    assert holder is not None and holder.authid == "control"
    first.leave()
    await until(lambda: hub.dealer.callee(SLOW) is None, "the registration to go with its callee")
    caller = await _attach(hub, "operator-console")
    with pytest.raises(ApplicationError) as nobody:
        await caller.call(SLOW)
    assert nobody.value.error == "wamp.error.no_such_procedure"
    second, _ = await _slow_callee(hub, "control-2")
    assert hub.dealer.callee(SLOW).authid == "control-2"
    for session in (caller, second):
        session.leave()
