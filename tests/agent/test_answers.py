"""What the control plane hears from a node's own procedures over real mutual TLS, when a call does not fit or the agent fails.

Before, the agent's procedures (``llmgw.node.<id>.*``) were autobahn's
callee's: a call with the wrong arguments came back as Python's sentence
("AgentSession.start_shard() missing 1 required positional argument:
'spec'"), and a handler's own failure as its exception's text, which the
control plane relays to operators.  Now the agent checks a call against the
procedure's signature by the hub's rule (``llmgw.link.answers``) and words
its own failures as one sentence; the traceback stays in the agent's log.
"""

from __future__ import annotations

import sys

import pytest
import pytest_twisted
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import CallOptions
from twisted.internet import reactor
from twisted.logger import LogLevel

from llmgw.agent.service import Agent, AgentSession
from llmgw.config import load_agent_config
from llmgw.link import uris
from llmgw.link.client import client_service
from llmgw.link.hub import Hub
from tests.agent.installs import StandInInstaller
from tests.link.conftest import close, files, serve
from tests.link.test_limits import Logged
from tests.support.wait import until

SAME_VERSION = "check that node01's agent and the server run the same llmgw version"
FAULT = ("node01's agent failed while answering this call (its fault, not the caller's); "
         "its log has the details: `llmgw ctl logs node01`")
PYTHON = ("positional", "()", "Error", "Traceback", "self", "object", "missing", "unhashable", "Errno",
          sys.prefix)


@pytest_twisted.async_yield_fixture
async def node01(pki, tmp_path):
    """A hub on real TLS with the stand-in control plane, and node01's real agent session joined to it."""
    hub = Hub(reactor)
    port = await serve(hub, pki)
    await hub.control.register(lambda inventory: {"node_id": "node01"}, uris.AGENT_REGISTER)
    (tmp_path / "agent.yaml").write_text(
        f'hub: "{hub.address.url}"\ntls: {{ca: {pki}/ca.crt, cert: {pki}/node01.crt, key: {pki}/node01.key}}\n'
        f"state_dir: {tmp_path / 'state'}\nweights_dirs: [{tmp_path / 'weights'}]\n"
    )
    agent = Agent(reactor, load_agent_config(tmp_path / "agent.yaml"), "node01", hub.address,
                  platform="linux x86_64", installer=StandInInstaller)
    service = client_service(reactor, hub.address, files(pki, "node01"), lambda config: AgentSession(config, agent))
    service.startService()
    await until(lambda: agent.registered_once, "node01 to register")
    yield hub, agent
    await service.stopService()
    await close(hub, port)


async def refusal(hub: Hub, verb: str, *args, **kwargs) -> ApplicationError:
    """What the control plane hears calling *verb* on node01 with *args* and *kwargs*: it must be an ERROR."""
    with pytest.raises(ApplicationError) as refused:
        await hub.control.call(uris.node_uri("node01", verb), *args, options=CallOptions(timeout=10_000), **kwargs)
    return refused.value


def python_in(sentence: str) -> list[str]:
    return [internal for internal in PYTHON if internal in sentence]


@pytest_twisted.ensureDeferred
async def test_a_call_that_does_not_fit_a_node_s_procedure_is_refused_in_llmgw_s_words(node01):
    hub, agent = node01
    assert await hub.control.call(uris.node_uri("node01", uris.NODE_CORDON), True) is True  # a call that fits
    start = uris.node_uri("node01", uris.NODE_START_SHARD)
    logs = uris.node_uri("node01", uris.NODE_LOGS)
    cases = [
        ((uris.NODE_START_SHARD,), {}, f"{start} takes 1 argument (spec); it was sent no arguments"),
        ((uris.NODE_START_SHARD, {}, {}), {}, f"{start} takes 1 argument (spec); it was sent 2 arguments"),
        ((uris.NODE_LOGS, "agent", 5, 6), {},
         f"{logs} takes up to 2 arguments (source, n); it was sent 3 arguments"),
        ((uris.NODE_LOGS,), {"colour": "red"},
         f"{logs} takes up to 2 arguments (source, n); it was sent no arguments and the keyword argument colour"),
        ((uris.NODE_PING, 1), {}, f"{uris.node_uri('node01', uris.NODE_PING)} takes no arguments; it was sent 1 argument"),
        ((uris.NODE_STOP_SHARD,), {"shard_id": "s/0/0", "now": True},
         f"{uris.node_uri('node01', uris.NODE_STOP_SHARD)} takes 1 argument (shard_id); "
         "it was sent no arguments and the keyword arguments shard_id, now"),
    ]
    for (verb, *args), kwargs, takes in cases:
        refused = await refusal(hub, verb, *args, **kwargs)
        assert (refused.error, refused.args) == (uris.ERROR_INVALID_ARGUMENT, (f"{takes}: {SAME_VERSION}",)), (verb, args)
        assert refused.kwargs == {}
    # A wrong type where the procedure takes an id: refused as the caller's mistake, not a failure of the node's.
    for verb in (uris.NODE_DRAIN_SHARD, uris.NODE_STOP_SHARD):
        refused = await refusal(hub, verb, {"not": "an id"})
        assert refused.error == uris.ERROR_INVALID_ARGUMENT and not python_in(refused.args[0]), refused.args


@pytest_twisted.ensureDeferred
async def test_a_node_that_fails_answering_says_so_in_one_sentence_and_keeps_the_traceback(node01, monkeypatch):
    hub, agent = node01
    # A real failure: the cordon file's place is taken by a directory.
    (agent.state_dir / "cordoned").mkdir(parents=True)

    async def vanished(shard_id):
        raise KeyError(f"{sys.prefix}/lib/secret")

    monkeypatch.setattr(agent, "stop_fetching", lambda shard_id: None)
    monkeypatch.setattr(agent.supervisor, "stop", vanished)
    with Logged() as logged:
        failures = [await refusal(hub, uris.NODE_CORDON, False), await refusal(hub, uris.NODE_STOP_SHARD, "s/0/0")]
        await until(lambda: len([line for line in logged.lines() if "Traceback" in line]) == 2,
                    "the agent to log both tracebacks")
    for failed in failures:
        assert (failed.error, failed.args, failed.kwargs) == (uris.ERROR_RUNTIME, (FAULT,), {})
    tracebacks = [line for line in logged.lines() if "Traceback" in line]
    assert "IsADirectoryError" in tracebacks[0] and "KeyError" in tracebacks[1]


@pytest_twisted.ensureDeferred
async def test_a_log_line_no_utf_8_encodes_reaches_the_operator_replaced(node01):
    hub, agent = node01
    agent.log_buffer({"log_format": "skipped {path}", "path": "/weights/caf\udce9.gguf", "log_level": LogLevel.warn})
    answer = await hub.control.call(uris.node_uri("node01", uris.NODE_LOGS), "agent", 1)
    [line] = answer["lines"]
    assert line.endswith("[warn] skipped /weights/caf?.gguf")


@pytest_twisted.ensureDeferred
async def test_an_answer_the_link_cannot_carry_is_said_so_in_llmgw_s_words(node01, monkeypatch):
    hub, agent = node01
    for n in range(1800):  # 18 MB of the agent's own log: more than a link message may be
        agent.log_buffer({"log_format": "{n} {text}", "n": n, "text": "x" * 10_000, "log_level": LogLevel.info})
    too_big = await refusal(hub, uris.NODE_LOGS, "agent", 10_000)
    assert (too_big.error, too_big.args) == (uris.ERROR_LIMIT, (
        "node01's agent could not send its answer to this call: it is larger than the 16 MiB a link message may be; "
        "ask for less; its log has the details",))
    # An answer holding what no UTF-8 encodes (a stand-in for a status naming an undecodable file).
    monkeypatch.setattr(agent.supervisor, "drain", lambda shard_id: {"reason": "no such file /w/caf\udce9"})
    monkeypatch.setattr("llmgw.agent.service.to_wire", lambda value: value)
    unsendable = await refusal(hub, uris.NODE_DRAIN_SHARD, "s/0/0")
    assert (unsendable.error, unsendable.args) == (uris.ERROR_RUNTIME, (
        "node01's agent could not send its answer to this call: it holds text the link cannot carry (not UTF-8); "
        "its log has the details",))
    assert await hub.control.call(uris.node_uri("node01", uris.NODE_CORDON), False) is False  # the session goes on
