"""What the hub takes off the wire: one JSON frame made into one WAMP message, or a refusal.

autobahn's WebSocket protocol parses frames itself and, on a malformed URI
or anything it cannot parse, logs a critical traceback and drops the
connection.  The hub parses here instead, so that what the spec answers
with an ERROR (a malformed URI: ``wamp.error.invalid_uri``) is answered,
what it answers with nothing (an unacknowledged PUBLISH) is not, and a
message nested deeper than llmgw's records ever are is refused in one line
before anything recurses through it.
"""

from __future__ import annotations

import functools
import json
import re

from autobahn.wamp import message
from autobahn.wamp.exception import ProtocolError
from autobahn.wamp.serializer import JsonSerializer

from llmgw.link.ids import MAX_ID

ERROR_INVALID_URI = "wamp.error.invalid_uri"
ERROR_INVALID_ARGUMENT = "wamp.error.invalid_argument"

# The Basic Profile's loose URI rule ("Identifiers"): components are not
# empty and hold no '.', '#' or whitespace.  A prefix subscription's topic
# may end in '.' (llmgw.event.).
# \Z, not $: "llmgw.cp.nodes\n" is no URI.
_URI = re.compile(r"\A([^\s.#]+\.)*([^\s.#]+)\Z")
_PREFIX_URI = re.compile(r"\A([^\s.#]+\.)*([^\s.#]*)\Z")

# Requests the hub answers with ERROR when it refuses them, and where their URI is.
_ANSWERED = {
    message.Publish.MESSAGE_TYPE: 3,
    message.Subscribe.MESSAGE_TYPE: 3,
    message.Call.MESSAGE_TYPE: 3,
    message.Register.MESSAGE_TYPE: 3,
    message.Unsubscribe.MESSAGE_TYPE: None,
    message.Unregister.MESSAGE_TYPE: None,
}
_URI_SHOWN = 100


class Violation(Exception):
    """The frame is not a WAMP message at all: the session ends with ABORT."""


class MessageRefused(Exception):
    """A WAMP message the hub will not act on; ``answer`` says whether the sender hears why."""

    def __init__(self, kind: int, request: int | None, error: str, why: str, answer: bool):
        super().__init__(why)
        self.kind = kind
        self.request = request
        self.error = error
        self.why = why
        self.answer = answer

    def reply(self) -> message.Error:
        return message.Error(self.kind, self.request, self.error, args=[self.why])


def decode(payload: bytes, is_binary: bool, max_depth: int):
    """The message in *payload*; raises ``Violation`` or ``MessageRefused``."""
    if is_binary:
        raise Violation("a binary frame on a wamp.2.json connection")
    try:
        raw = json.loads(payload)
    except RecursionError:
        raise MessageRefused(0, None, ERROR_INVALID_ARGUMENT, "a message nested too deep to parse; the link takes "
                             f"{max_depth} levels (link.max_message_depth)", answer=False) from None
    except ValueError as e:
        # json's own words ("Expecting value: line 1 column 1 (char 0)") name Python, not the frame.
        where = f" at byte {e.pos}" if isinstance(getattr(e, "pos", None), int) else ""
        raise Violation(f"a text frame that is not JSON (it stops parsing{where}); WAMP's wamp.2.json sends "
                        "each message as one JSON list") from None
    if not isinstance(raw, list) or not raw or not _is_int(raw[0]):
        raise Violation("a WAMP message is a JSON list that starts with the message type")
    kind = raw[0]
    klass = JsonSerializer.MESSAGE_TYPE_MAP.get(kind)
    if klass is None:
        raise Violation(f"no WAMP message has type {kind}")
    request = raw[1] if len(raw) > 1 and _is_int(raw[1]) and 0 <= raw[1] <= MAX_ID else None
    # Nothing nests deeper than it has brackets: most messages (every
    # heartbeat) have too few to need the walk.
    depth = 0 if payload.count(b"[") + payload.count(b"{") <= max_depth else nesting(raw, max_depth)
    if depth > max_depth:
        raise _refusal(raw, kind, request, ERROR_INVALID_ARGUMENT,
                       f"{klass.__name__.upper()} nests deeper than {max_depth} levels, the most the link takes "
                       "(link.max_message_depth)")
    if kind in _ANSWERED and _ANSWERED[kind] is not None and request is not None and len(raw) > _ANSWERED[kind]:
        uri = raw[_ANSWERED[kind]]
        if not _valid_uri(kind, uri, raw[2] if len(raw) > 2 else None):
            if not isinstance(uri, str):
                what = _JSON_TYPES.get(type(uri).__name__, "a value")
            else:  # a peer's text, in a log line and its answer: at most _URI_SHOWN characters of it
                what = repr(uri) if len(uri) <= _URI_SHOWN else f"{uri[:_URI_SHOWN]!r}... ({len(uri)} characters)"
            raise _refusal(raw, kind, request, ERROR_INVALID_URI, f"{what} is not a WAMP URI "
                           "(dot-separated components, none empty, no '#', whitespace or control characters)")
        if kind == message.Call.MESSAGE_TYPE:
            call = plain_call(raw, request)
            if call is not None:
                return call
    try:
        return klass.parse(raw)
    except ProtocolError as e:
        raise Violation(_json_words(str(e))) from None
    except Exception:  # autobahn's parsers assert and index as well as raise, in Python's words
        raise Violation(f"a malformed {klass.__name__.upper()}: its fields are not the ones the WAMP Basic Profile "
                        "gives it (their number, their types)") from None


_PYTHON_TYPE = re.compile(r"<class '(\w+)'>")
_JSON_TYPES = {"str": "a string", "int": "an integer", "float": "a number", "bool": "true or false", "list": "a list",
               "tuple": "a list", "dict": "a mapping", "NoneType": "null"}


def _json_words(text: str) -> str:
    """autobahn's ProtocolError sentence with Python's type names ("<class 'str'>") in JSON's words."""
    return _PYTHON_TYPE.sub(lambda m: _JSON_TYPES.get(m.group(1), "a value of another type"), text)


def _refusal(raw: list, kind: int, request: int | None, error: str, why: str) -> MessageRefused:
    if kind == message.Publish.MESSAGE_TYPE:
        options = raw[2] if len(raw) > 2 and isinstance(raw[2], dict) else {}
        answer = options.get("acknowledge") is True
    elif kind in (message.Yield.MESSAGE_TYPE, message.Error.MESSAGE_TYPE):
        # A callee's answer: its caller hears of the refusal, not the callee.
        if kind == message.Error.MESSAGE_TYPE:
            request = raw[2] if len(raw) > 2 and _is_int(raw[2]) else None
        return MessageRefused(kind, request, error, why, answer=False)
    else:
        answer = kind in _ANSWERED
    return MessageRefused(kind, request, error, why, answer=answer and request is not None)


def _valid_uri(kind: int, uri, options) -> bool:
    if not isinstance(uri, str):
        return False
    prefix = kind == message.Subscribe.MESSAGE_TYPE and isinstance(options, dict) and options.get("match") == "prefix"
    if not uri:
        return False
    return (_matches if len(uri) <= _REMEMBERED_URI_CHARS else _matches.__wrapped__)(prefix, uri)


# A fleet calls a handful of URIs thousands of times a second: each is
# matched once, and what it gave remembered (a bounded number of short URIs).
_REMEMBERED_URI_CHARS = 256


@functools.lru_cache(maxsize=4096)
def _matches(prefix: bool, uri: str) -> bool:
    # Printable too: a URI reaches log lines, and an escape sequence in one would write to the reader's terminal.
    return bool((_PREFIX_URI if prefix else _URI).match(uri)) and uri.isprintable()


def plain_call(raw: list, request: int):
    """The CALL in *raw*, made without autobahn's ``Call.parse`` when it is a plain one; else None (``parse`` reads it).

    Plain: four to six elements, options empty or only a ``timeout``
    (an int, not negative), arguments a list and keyword arguments a
    mapping, as autobahn's clients send every call.  *raw* has passed
    ``decode``'s checks: its request id and procedure URI are valid.  What
    ``parse`` would make of it is what this makes (tests/link/test_inbound.py).
    """
    n = len(raw)
    if n < 4 or n > 6:
        return None
    options = raw[2]
    if type(options) is not dict:
        return None
    timeout = None
    if options:
        timeout = options.get("timeout")
        if len(options) != 1 or type(timeout) is not int or timeout < 0:
            return None
    args = raw[4] if n > 4 else None
    kwargs = raw[5] if n > 5 else None
    if (args is not None and type(args) is not list) or (n > 5 and type(kwargs) is not dict):
        return None
    return message.Call(request, raw[3], args=args, kwargs=kwargs, timeout=timeout)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def nesting(value, limit: int) -> int:
    """How deep *value*'s lists and mappings nest (the message's own list is 1), counted no further than *limit* + 1."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return depth
        deepest = max(deepest, depth)
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, (list, dict)))
    return deepest
