"""Every protocol violation ends its session with ABORT and a sentence in llmgw's words, over real mutual TLS.

Before, a frame that was not JSON was answered with Python's json error
("Expecting value: line 1 column 1 (char 0)"), a malformed message with
Python's exception ("IndexError: list index out of range") and autobahn's
type names ("<class 'str'>").
"""

from __future__ import annotations

import json

import pytest
import pytest_twisted
from autobahn.wamp import message

from llmgw.link import uris
from tests.link.conftest import files
from tests.link.test_limits import Logged
from tests.link.wire import ABORT, CALL, ERROR, HELLO, PUBLISH, REGISTER, SUBSCRIBE, WELCOME, wire_peer

# name -> (joined first?, the frame, words the ABORT's sentence holds)
VIOLATIONS = {
    "not JSON": (True, b"{not json", "not JSON"),
    "not JSON, before HELLO": (False, b"\x00\x01garbage", "not JSON"),
    "a JSON mapping": (True, json.dumps({"not": "wamp"}).encode(), "a JSON list"),
    "an empty list": (True, b"[]", "a JSON list"),
    "a message type nobody has": (True, b"[999, 1]", "no WAMP message has type 999"),
    "a CALL with too few fields": (True, json.dumps([CALL, 1]).encode(), "CALL"),
    "a CALL whose request id is a string": (True, json.dumps([CALL, "1", {}, uris.CP_NODES]).encode(), "CALL"),
    "a CALL whose options are a list": (True, json.dumps([CALL, 1, [], uris.CP_NODES, []]).encode(), "CALL"),
    "a REGISTER with too many fields": (True, json.dumps([REGISTER, 1, {}, "llmgw.node.node01.x", 1, 2]).encode(),
                                        "REGISTER"),
    "a SUBSCRIBE whose options are a string": (True, json.dumps([SUBSCRIBE, 1, "x", uris.EVENT_NODE]).encode(),
                                               "SUBSCRIBE"),
    "a PUBLISH whose arguments are a number": (True, json.dumps([PUBLISH, 1, {}, uris.EVENT_NODE, 5]).encode(),
                                               "PUBLISH"),
    "a CALL before HELLO": (False, json.dumps([CALL, 1, {}, uris.CP_NODES, []]).encode(), "expected HELLO, got CALL"),
    "a second HELLO": (True, json.dumps([HELLO, uris.REALM, {"roles": {"caller": {}}}]).encode(), "HELLO"),
    "a router's WELCOME": (True, json.dumps([WELCOME, 1, {}]).encode(), "WELCOME"),
    "a HELLO with no roles": (False, json.dumps([HELLO, uris.REALM, {}]).encode(), "HELLO"),
}
PYTHON = ("<class", "Error", "line 1 column", "(char ", "Expecting", "index out of range", "NoneType", "object",
          "Traceback", "assert")


@pytest.mark.parametrize("name", list(VIOLATIONS))
@pytest_twisted.ensureDeferred
async def test_a_violation_ends_the_session_with_abort_in_llmgw_s_words(hub, pki, name):
    joined, frame, words = VIOLATIONS[name]
    peer = await wire_peer(hub, files(pki, "node01"))
    if joined:
        await peer.hello()
    before = hub.refusals["protocol_violation"]
    peer.send_raw(frame)
    abort = await peer.next()
    assert abort[0] == ABORT and abort[2] == "wamp.error.protocol_violation", abort
    sentence = abort[1]["message"]
    assert words in sentence, sentence
    for internal in PYTHON:
        assert internal not in sentence, sentence
    await peer.until_closed()
    assert hub.refusals["protocol_violation"] == before + 1
    assert [s for s in hub.sessions.values() if s.authid == "node01"] == []


@pytest_twisted.ensureDeferred
async def test_a_malformed_uri_is_answered_in_json_s_words_and_bounded(hub, pki):
    peer = await wire_peer(hub, files(pki, "node01"))
    await peer.hello()
    peer.send(CALL, 1, {}, 42, [])
    peer.send(CALL, 2, {}, "llmgw. " + "x" * 100_000, [])
    number, long = await peer.next(), await peer.next()
    assert number[5] == ["an integer is not a WAMP URI (dot-separated components, none empty, no '#', whitespace or "
                         "control characters)"]
    assert long[5][0].startswith("'llmgw. xxx") and "... (100007 characters) is not a WAMP URI" in long[5][0]
    assert len(long[5][0]) < 250


@pytest_twisted.ensureDeferred
async def test_every_error_the_hub_answers_carries_a_sentence(hub, pki):
    peer = await wire_peer(hub, files(pki, "node01"))
    await peer.hello()
    peer.send(message.Unregister.MESSAGE_TYPE, 1, 12345)
    peer.send(message.Unsubscribe.MESSAGE_TYPE, 2, 678)
    unregistered, unsubscribed = await peer.next(), await peer.next()
    assert unregistered[4:] == ["wamp.error.no_such_registration", ["this session holds no registration 12345"]]
    assert unsubscribed[4:] == ["wamp.error.no_such_subscription", ["this session holds no subscription 678"]]


@pytest_twisted.ensureDeferred
async def test_a_claimed_authid_reaches_the_log_escaped_and_bounded(hub, pki):
    forged = "node02\n2026-12-01T00:00:00 [-] joined: control\x1b[2J" + "x" * 5000
    peer = await wire_peer(hub, files(pki, "node01"))
    with Logged() as logged:
        peer.send(HELLO, uris.REALM, {"roles": {"caller": {}}, "authid": forged})
        abort = await peer.next()
    assert abort[0] == ABORT and abort[2] == uris.ERROR_NOT_AUTHORIZED
    assert "\n" not in abort[1]["message"] and len(abort[1]["message"]) < 250
    [line] = [line for line in logged.lines() if "the HELLO claims" in line]
    assert "\n" not in line and "\x1b" not in line and len(line) < 400
    assert "'node02\\n2026-12-01T00:00:00 [-] joined: control\\x1b[2Jxxx" in line


@pytest_twisted.ensureDeferred
async def test_a_uri_reaches_the_log_without_control_characters_and_bounded(hub, pki):
    peer = await wire_peer(hub, files(pki, "node01"))
    await peer.hello()
    with Logged() as logged:
        peer.send(CALL, 1, {}, "llmgw.cp.\x1b[2Jx", [])
        peer.send(CALL, 2, {}, "llmgw.cp.nodes" + "x" * 100_000, [])  # a node may not: refused and logged
        peer.send(CALL, 3, {}, uris.CP_AGENT + "whoami\n", [])  # a trailing newline is no URI either
        escaped, refused, newline = await peer.next(), await peer.next(), await peer.next()
    assert escaped[4] == "wamp.error.invalid_uri" and "'llmgw.cp.\\x1b[2Jx'" in escaped[5][0]
    assert newline[:3] == [ERROR, CALL, 3] and newline[4] == "wamp.error.invalid_uri"
    assert refused[4] == uris.ERROR_NOT_AUTHORIZED
    lines = [line for line in logged.lines() if "node01" in line]
    assert len(lines) == 3 and all("\x1b" not in line and "\n" not in line and len(line) < 800 for line in lines), lines
