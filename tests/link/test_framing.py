"""The hub's own WebSocket framing (``HubProtocol.processData`` and ``send``) against autobahn's, case by case.

The hub reads a whole, masked, unfragmented text frame and writes an
unfragmented frame itself, and hands every other case to autobahn.  Each
case here is sent as raw bytes over real mutual TLS on 127.0.0.1, once with
the hub's framing and once with autobahn's alone (``own_framing`` False),
and what the peer got back (the messages, and the close code if the hub
closed) must be the same, and what the case expects.
"""

from __future__ import annotations

import json
import struct

import pytest
import pytest_twisted
from autobahn.wamp import message
from autobahn.websocket.protocol import WebSocketProtocol
from twisted.internet import reactor, task
from twisted.internet.testing import StringTransport

from llmgw.link import uris
from llmgw.link.peer import HubProtocol, HubSession, unmask
from llmgw.link.session import LinkJsonSerializer
from tests.link.conftest import files
from tests.link.wire import CALL, ERROR, RESULT, wire_peer

MASK = b"\x12\x34\x56\x78"
WHOAMI = uris.CP_AGENT + "whoami"


def frame(payload: bytes, opcode: int = 1, fin: bool = True, mask: bytes | None = MASK, long_form: int | None = None) -> bytes:
    """One WebSocket frame as a client writes it (RFC 6455, 5.2); *long_form* forces a length form (126 or 127)."""
    first = (0x80 if fin else 0) | opcode
    n = len(payload)
    masked = 0x80 if mask is not None else 0
    if long_form == 126 or (long_form is None and 126 <= n <= 0xFFFF):
        header = bytes((first, masked | 126)) + struct.pack("!H", n)
    elif long_form == 127 or n > 0xFFFF:
        header = bytes((first, masked | 127)) + struct.pack("!Q", n)
    else:
        header = bytes((first, masked | n))
    if mask is None:
        return header + payload
    return header + mask + unmask(payload, mask)


def call(request: int, pad: int = 0) -> bytes:
    """A CALL of whoami, padded to more than *pad* bytes (then answered with an ERROR: whoami takes no arguments)."""
    return json.dumps([CALL, request, {}, WHOAMI, ["x" * pad] if pad else []]).encode()


def _ping_of_a_frame() -> bytes:
    """A masked ping whose payload, as it is on the wire, is a whole CALL frame (request 20)."""
    inner = frame(call(20))
    return frame(unmask(inner, MASK), opcode=9)


def fragmented(payload: bytes) -> bytes:
    """*payload* as one text message in three frames."""
    return frame(payload[:10], fin=False) + frame(payload[10:20], opcode=0, fin=False) + frame(payload[20:], opcode=0)


PING_OF_A_FRAME = _ping_of_a_frame()
HELLO = json.dumps([1, uris.REALM, {"roles": {"caller": {}}}]).encode()

# autobahn fails a connection by dropping it (its ``failByDrop``): the peer
# sees no close frame, 1006.  Which of its checks found the fault is in the
# hub's log; the tests below ask that both ways end the connection alike.
DROPPED = 1006

# name -> (the bytes after HELLO, the RESULT requests expected in order, the close code expected or None)
CASES = {
    "short": (frame(call(1)), [1], None),
    "medium (two-byte length)": (frame(call(2, pad=1000)), [2], None),
    "long (eight-byte length)": (frame(call(3, pad=70_000)), [3], None),
    "two frames in one write": (frame(call(4)) + frame(call(5, pad=300)), [4, 5], None),
    "fragmented": (fragmented(call(6, pad=50)), [6], None),
    "a ping between two calls": (frame(call(7)) + frame(b"hi", opcode=9) + frame(call(8)), [7, 8], None),
    "invalid UTF-8": (frame(b'[48, 9, {}, "' + WHOAMI.encode() + b'", ["\xff\xfe"]]'), [], DROPPED),
    "a text frame that ends within a code point": (frame(call(10)[:-2] + b"\xe2\x82"), [], DROPPED),
    "length not in its shortest form": (frame(call(11), long_form=126), [], DROPPED),
    "unmasked": (frame(call(12), mask=None), [], DROPPED),
    "a reserved opcode": (frame(call(13), opcode=3), [], DROPPED),
    "a whole text frame inside a fragmented message": (frame(b"[48,", fin=False) + frame(call(14)), [], DROPPED),
    # In pieces with a turn of the reactor between (each its own TLS record, its own read).
    "a frame cut after its header": ([frame(call(15, pad=200))[:12], frame(call(15, pad=200))[12:]], [15], None),
    "a two-byte length cut in two": ([frame(call(16, pad=200))[:3], frame(call(16, pad=200))[3:]], [16], None),
    # A ping cut after its header, whose payload on the wire is a whole CALL frame: a ping's, not a call.
    "a ping cut after its header, its payload a frame's bytes": (
        [PING_OF_A_FRAME[:6], PING_OF_A_FRAME[6:] + frame(call(21))], [21], None),
    "a frame cut in its mask": ([frame(call(17))[:4], frame(call(17))[4:] + frame(call(18))], [17, 18], None),
}


async def _outcome(hub, pki, raw: bytes | list[bytes], answers: int, closes: bool, *, limit: tuple[str, int] | None = None):
    """What a peer that joined and then wrote *raw* (or its pieces, a turn apart) gets: (message type, request) for *answers* messages, and the close code.

    With *closes*, the hub is waited on to close the connection; else the peer closes it.
    """
    peer = await wire_peer(hub, files(pki, "node01"))
    peer.transport.write(frame(HELLO))
    welcome = await peer.next()
    assert welcome[0] == 2, welcome
    if limit is not None:
        (remote,) = [s for s in hub.sessions.values() if s.authid == "node01"]
        setattr(remote.transport, *limit)
    for piece in raw if isinstance(raw, list) else [raw]:
        peer.transport.write(piece)
        await task.deferLater(reactor, 0, lambda: None)
    got = [await peer.next() for _ in range(answers)]
    if closes:
        code = (await peer.until_closed())[0]
    else:
        code = None
        peer.transport.loseConnection()
        await peer.until_closed()
    # whoami takes no arguments: a padded call is answered with an ERROR (its request third), by the hub
    # itself, so it can overtake a RESULT the control plane gives: the answers are compared in request order.
    return sorted(((m[0], m[2] if m[0] == ERROR else m[1]) for m in got), key=lambda answer: answer[1]), code


@pytest.mark.parametrize("name", list(CASES))
@pytest_twisted.ensureDeferred
async def test_the_hubs_framing_answers_each_case_as_autobahns_does(hub, pki, monkeypatch, name):
    raw, results, code = CASES[name]
    outcomes = {}
    for own in (True, False):
        monkeypatch.setattr(HubProtocol, "own_framing", own)
        outcomes[own] = await _outcome(hub, pki, raw, len(results), code is not None)
    assert outcomes[True] == outcomes[False]
    got, closed = outcomes[True]
    assert [request for _, request in got] == results
    assert all(kind in (RESULT, ERROR) for kind, _ in got)
    assert closed == code


@pytest.mark.parametrize("limit", ["maxFramePayloadSize", "maxMessagePayloadSize"])
@pytest_twisted.ensureDeferred
async def test_a_frame_over_the_links_limit_closes_as_autobahn_closes_it(hub, pki, monkeypatch, limit):
    raw = frame(call(1, pad=400))
    outcomes = {}
    for own in (True, False):
        monkeypatch.setattr(HubProtocol, "own_framing", own)
        outcomes[own] = await _outcome(hub, pki, raw, 0, True, limit=(limit, 100))
    assert outcomes[True] == outcomes[False] == ([], DROPPED)


@pytest_twisted.ensureDeferred
async def test_a_plain_call_is_read_without_autobahns_frame_methods(hub, pki, monkeypatch):
    begun = []
    original = WebSocketProtocol.onFrameBegin
    monkeypatch.setattr(WebSocketProtocol, "onFrameBegin", lambda self: begun.append(1) or original(self))
    raw = frame(call(1))
    counted = {}
    for own in (True, False):
        monkeypatch.setattr(HubProtocol, "own_framing", own)
        begun.clear()
        assert (await _outcome(hub, pki, raw, 1, False))[0] == [(RESULT, 1)]
        counted[own] = len(begun)
    # Both runs count the peer's side too (autobahn's, reading WELCOME, RESULT
    # and the close); autobahn's hub side adds HELLO, the CALL and the close.
    assert counted[False] - counted[True] == 2


def _offline_protocol(hub) -> tuple[HubProtocol, StringTransport]:
    """A hub protocol on a transport in memory, open, as after a handshake (for what it writes)."""
    factory = hub.websocket_factory()
    protocol = factory.buildProtocol(None)
    transport = StringTransport()
    protocol.makeConnection(transport)
    if protocol.openHandshakeTimeoutCall is not None:
        protocol.openHandshakeTimeoutCall.cancel()
        protocol.openHandshakeTimeoutCall = None
    protocol.state = WebSocketProtocol.STATE_OPEN
    protocol._session = HubSession(hub)
    protocol._serializer = LinkJsonSerializer()
    return protocol, transport


@pytest.mark.parametrize("size", [0, 1, 100, 125, 126, 127, 1000, 65_535, 65_536, 200_000])
def test_the_hubs_frames_are_byte_for_byte_autobahns(size):
    from llmgw.link.hub import Hub

    hub = Hub(reactor)
    written = {}
    stats = {}
    for own in (True, False):
        protocol, transport = _offline_protocol(hub)
        protocol.own_framing = own
        # A RESULT whose JSON is *size* bytes or a little more.
        protocol.send(message.Result(7, args=["y" * max(size - 15, 0)]))
        written[own] = transport.value()
        stats[own] = protocol.trafficStats.__json__()
    assert written[True] == written[False]
    assert stats[True] == stats[False]
    assert written[True][0] == 0x81  # one final text frame


def test_a_message_to_a_closed_link_is_refused_as_autobahns_is():
    from autobahn.exception import Disconnected
    from autobahn.wamp.exception import TransportLost

    from llmgw.link.hub import Hub

    protocol, _ = _offline_protocol(Hub(reactor))
    protocol.state = WebSocketProtocol.STATE_CLOSING
    with pytest.raises(Disconnected):
        protocol.send(message.Result(1, args=[None]))
    protocol._session = None
    with pytest.raises(TransportLost):
        protocol.send(message.Result(1, args=[None]))


@pytest.mark.parametrize("size", [0, 1, 3, 4, 5, 125, 126, 1000, 70_001])
def test_unmask_is_rfc_6455s_xor(size):
    import os

    payload, mask = os.urandom(size), os.urandom(4)
    assert unmask(payload, mask) == bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    assert unmask(unmask(payload, mask), mask) == payload
