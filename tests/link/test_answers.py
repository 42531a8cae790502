"""What a caller over real mutual TLS hears when its call does not fit, or the server fails answering it.

Before, a CALL with the wrong number of arguments was answered with
Python's own sentence ("agent_register() missing 1 required positional
argument"), and a handler's own failure with its exception's text.  Now the
hub refuses a call that does not fit the handler's signature in words that
name the procedure and what it takes, and a failure on the server's side
reaches the caller as one sentence; its traceback stays in the server's log.
"""

from __future__ import annotations

import pytest
import pytest_twisted
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import ComponentConfig, RegisterOptions
from twisted.internet import defer, reactor

from llmgw.control.fleet import Fleet
from llmgw.control.plane import ControlSession
from llmgw.errors import ConfigError
from llmgw.link import uris
from llmgw.link.answers import SERVER_FAULT
from llmgw.link.hub import Hub
from tests.link.conftest import Control, close, join, serve

ENROL = uris.CP_AGENT + "enrol"
BROKEN = uris.CP_AGENT + "broken"
MISCONFIGURED = uris.CP_AGENT + "misconfigured"
SAME_VERSION = "check that this client and the server run the same llmgw version"


class StrictControl(Control):
    """The stand-in control plane, with handlers that take arguments, fail, and fail in llmgw's words."""

    def __init__(self, config):
        super().__init__(config)
        self.user_errors: list[str] = []

    async def onJoin(self, details):
        await self.register(self.enrol, ENROL, RegisterOptions(details_arg="details"))
        await self.register(self.broken, BROKEN)
        await self.register(self.misconfigured, MISCONFIGURED)
        self.traceback_app = True  # as a session set to send tracebacks would be: the hub sends none anyway
        await super().onJoin(details)

    def enrol(self, inventory, labels=None, *, force=False, details=None):
        return {"gpus": len(inventory["gpus"]), "by": details.caller_authid}

    def broken(self):
        raise KeyError("gpus")

    def misconfigured(self):
        raise ConfigError("/etc/llmgw/server.yaml: models.m1.engine: no engine 'vllm2'; the engines are llama.cpp, vllm")

    def onUserError(self, fail, msg):
        self.user_errors.append(type(fail.value).__name__)


@pytest_twisted.async_yield_fixture
async def strict_hub(pki, monkeypatch):
    monkeypatch.setattr("tests.link.conftest.Control", StrictControl)
    hub = Hub(reactor)
    port = await serve(hub, pki)
    yield hub
    await close(hub, port)


async def refusal(node, procedure, *args, **kwargs) -> ApplicationError:
    with pytest.raises(ApplicationError) as refused:
        await node.call(procedure, *args, **kwargs)
    return refused.value


@pytest_twisted.ensureDeferred
async def test_a_call_that_does_not_fit_its_procedure_is_refused_in_llmgw_s_words(strict_hub, pki):
    node = await join(strict_hub, pki, "node01")
    assert await node.call(ENROL, {"gpus": [0, 1]}, force=True) == {"gpus": 2, "by": "node01"}
    takes = f"{ENROL} takes 1 argument (inventory), up to 1 more (labels) and the keyword argument force"
    cases = [
        ((), {}, f"{takes}; it was sent no arguments: {SAME_VERSION}"),
        (({}, {}, {}), {}, f"{takes}; it was sent 3 arguments: {SAME_VERSION}"),
        (({},), {"colour": "red"}, f"{takes}; it was sent 1 argument and the keyword argument colour: {SAME_VERSION}"),
    ]
    for args, kwargs, sentence in cases:
        refused = await refusal(node, ENROL, *args, **kwargs)
        assert (refused.error, refused.args) == (uris.ERROR_INVALID_ARGUMENT, (sentence,)), (args, kwargs)
    assert strict_hub.control.user_errors == []  # the caller's mistake: nothing for the server's log
    node.leave()


@pytest_twisted.ensureDeferred
async def test_a_caller_s_keyword_names_reach_the_refusal_escaped_and_bounded(strict_hub, pki):
    node = await join(strict_hub, pki, "node01")
    hostile = {"x\n2026-12-01 [-] joined: control\x1b[2J" + "y" * 1000: 1, **{f"k{i}": i for i in range(10_000)}}
    refused = await refusal(node, ENROL, {}, **hostile)
    [sentence] = refused.args
    assert "\n" not in sentence and "\x1b" not in sentence
    assert "x\\n2026-12-01 [-] joined: control\\x1b[2Jyyyy" in sentence
    assert sentence.endswith(f"k0, k1, k2, k3 and 9996 more: {SAME_VERSION}")
    assert len(sentence) < 400
    node.leave()


@pytest_twisted.ensureDeferred
async def test_a_handler_that_fails_tells_the_caller_it_was_the_server_and_sends_no_internals(strict_hub, pki):
    node = await join(strict_hub, pki, "node01")
    wrong_type = await refusal(node, ENROL, "not a mapping")  # fits the signature; fails inside the handler
    broken = await refusal(node, BROKEN)
    for failed in (wrong_type, broken):
        assert (failed.error, failed.args, failed.kwargs) == (uris.ERROR_RUNTIME, (SERVER_FAULT,), {})
    misconfigured = await refusal(node, MISCONFIGURED)
    assert misconfigured.args == ("/etc/llmgw/server.yaml: models.m1.engine: no engine 'vllm2'; "
                                  "the engines are llama.cpp, vllm",)  # llmgw's own error is already in words
    assert strict_hub.control.user_errors == ["TypeError", "KeyError", "ConfigError"]  # the server's log has each
    node.leave()


@pytest_twisted.async_yield_fixture
async def plane_hub(pki):
    """The real control plane attached to a hub on real TLS."""
    hub = Hub(reactor)
    port = await serve(hub, pki, control=False)
    control = ControlSession(ComponentConfig(realm=uris.REALM), lambda emit: Fleet(reactor, emit))
    ready = defer.Deferred()
    control.on("ready", lambda *a: ready.called or ready.callback(None))
    hub.attach_local(control)
    await ready.addTimeout(5, reactor)
    yield hub
    await close(hub, port)


@pytest_twisted.ensureDeferred
async def test_the_control_plane_s_procedures_refuse_a_wrong_call_without_python_s_words(plane_hub, pki):
    node = await join(plane_hub, pki, "node01")
    operator = await join(plane_hub, pki, "alice")
    answers = [
        await refusal(node, uris.AGENT_REGISTER),  # the reviewers' case
        await refusal(node, uris.AGENT_REGISTER, {}, {}),
        await refusal(node, uris.AGENT_HEARTBEAT),  # answered directly by the hub
        await refusal(node, uris.AGENT_HEARTBEAT, {}, extra=1),
        await refusal(operator, uris.CP_NODES, bogus=True),
        await refusal(operator, uris.CP_STATUS, 1),
    ]
    for answer in answers:
        [sentence] = answer.args
        assert answer.error == uris.ERROR_INVALID_ARGUMENT, sentence
        assert sentence.endswith(SAME_VERSION), sentence
        for internal in ("positional", "()", "Error", "Traceback", "self"):
            assert internal not in sentence, sentence
    assert answers[0].args[0] == f"{uris.AGENT_REGISTER} takes 1 argument (inventory); it was sent no arguments: {SAME_VERSION}"
    node.leave()
    operator.leave()


def test_a_handler_that_cannot_be_hashed_is_checked_all_the_same():
    from llmgw.link.answers import argument_refusal

    class Handler:
        __hash__ = None

        def __call__(self, inventory, details=None):
            return inventory

    assert argument_refusal("p", Handler(), [{}], {}, "details") is None
    assert argument_refusal("p", Handler(), [], {}, "details").startswith("p takes 1 argument (inventory); it was sent no")
