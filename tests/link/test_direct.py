"""Procedures the in-process control plane answers directly: the same answers and refusals, no INVOCATION.

A node over real mutual TLS calls a control session attached in process
that names two of its procedures as direct; the session's own message
handler records every INVOCATION it is sent, so the test sees which path
each call took.
"""

from __future__ import annotations

import pytest
import pytest_twisted
from autobahn.wamp import message
from autobahn.wamp.exception import ApplicationError
from twisted.internet import reactor

from llmgw.link import uris
from llmgw.link.answers import SERVER_FAULT
from llmgw.link.hub import Hub
from tests.link.conftest import Control, close, join, serve

ECHO = uris.CP_AGENT + "echo"
BROKEN = uris.CP_AGENT + "broken"


class DirectControl(Control):
    def __init__(self, config):
        super().__init__(config)
        self.invoked: list[str] = []
        self.user_errors: list[str] = []

    async def onJoin(self, details):
        for uri in (ECHO, BROKEN):
            await self.register(lambda *a, **kw: None, uri)  # the registration the hub checks; not called
        await super().onJoin(details)

    def direct_procedures(self):
        return {ECHO: self.echo, BROKEN: self.broken}

    def echo(self, value, *, upper=False, details=None):
        if value == "refuse":
            raise ApplicationError(uris.ERROR_REFUSED, f"{details.caller_authid} may not say {value!r}")
        return {"said": value.upper() if upper else value, "by": details.caller_authid, "role": details.caller_authrole}

    def broken(self, details=None):
        raise KeyError("gpus")

    def onMessage(self, msg):
        if isinstance(msg, message.Invocation):
            self.invoked.append(msg.procedure)
        super().onMessage(msg)

    def onUserError(self, fail, msg):
        self.user_errors.append(type(fail.value).__name__)


@pytest_twisted.async_yield_fixture
async def direct_hub(pki, monkeypatch):
    monkeypatch.setattr("tests.link.conftest.Control", DirectControl)
    hub = Hub(reactor)
    port = await serve(hub, pki)
    assert isinstance(hub.control, DirectControl)
    yield hub
    await close(hub, port)


@pytest_twisted.ensureDeferred
async def test_a_direct_procedure_answers_with_the_callers_identity_and_no_invocation(direct_hub, pki):
    node = await join(direct_hub, pki, "node01")
    assert await node.call(ECHO, "hello", upper=True) == {"said": "HELLO", "by": "node01", "role": "node"}
    assert await node.call(uris.CP_AGENT + "whoami") == {"authid": "node01", "role": "node"}
    assert direct_hub.control.invoked == [uris.CP_AGENT + "whoami"]  # the other procedure went the usual way
    node.leave()


@pytest_twisted.ensureDeferred
async def test_a_direct_procedures_refusal_reaches_the_caller_in_its_words(direct_hub, pki):
    node = await join(direct_hub, pki, "node01")
    with pytest.raises(ApplicationError) as refused:
        await node.call(ECHO, "refuse")
    assert refused.value.error == uris.ERROR_REFUSED
    assert refused.value.args == ("node01 may not say 'refuse'",)
    with pytest.raises(ApplicationError) as broken:
        await node.call(BROKEN)
    assert broken.value.error == "wamp.error.runtime_error"
    assert broken.value.args == (SERVER_FAULT,)  # not "'gpus'": the traceback is the server's log's
    with pytest.raises(ApplicationError) as wrong:
        await node.call(ECHO)  # no value: refused before the handler runs, in llmgw's words
    assert wrong.value.error == "wamp.error.invalid_argument"
    assert wrong.value.args == (
        f"{ECHO} takes 1 argument (value) and the keyword argument upper; it was sent no arguments: "
        "check that this client and the server run the same llmgw version",
    )
    with pytest.raises(ApplicationError) as spoofed:
        await node.call(ECHO, "hi", details="forged")
    assert spoofed.value.args[0].startswith(f"{ECHO} was sent the keyword argument 'details', which the hub fills in")
    assert direct_hub.control.user_errors == ["ApplicationError", "KeyError"]  # the caller's mistakes are not the server's
    assert direct_hub.control.invoked == []
    node.leave()
