"""The hub's reader's shortcuts (``llmgw.link.inbound``) give what the long way gives.

Three shortcuts, each checked against what it stands for: a plain CALL is
made without autobahn's ``Call.parse`` (``plain_call``), a message with
fewer brackets than the depth limit is not walked for its depth, and a
short URI's check is remembered.
"""

from __future__ import annotations

import json

import pytest
from autobahn.wamp import message
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.link import inbound
from llmgw.link.inbound import MessageRefused, Violation, decode, nesting, plain_call

CALL = message.Call.MESSAGE_TYPE
URIS = st.sampled_from(["llmgw.cp.agent.heartbeat", "a.b", "x"])
JSON_LEAF = st.none() | st.booleans() | st.integers(-(2**60), 2**60) | st.text(max_size=8)
JSON = st.recursive(JSON_LEAF, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                    max_leaves=12)
OPTIONS = st.one_of(
    st.just({}),
    st.fixed_dictionaries({"timeout": st.integers(-5, 10**6)}),
    st.fixed_dictionaries({"timeout": st.text(max_size=3) | st.floats(allow_nan=False) | st.booleans()}),
    st.fixed_dictionaries({"receive_progress": st.booleans()}),
    st.fixed_dictionaries({"timeout": st.integers(0, 9), "receive_progress": st.booleans()}),
    st.dictionaries(st.text(max_size=6), JSON_LEAF, max_size=2),
    JSON_LEAF,
)
ARGS = st.one_of(st.lists(JSON, max_size=3), st.none(), st.text(max_size=5), st.dictionaries(st.text(max_size=3), JSON, max_size=2),
                 st.integers())
KWARGS = st.one_of(st.dictionaries(st.text(max_size=5), JSON, max_size=3), st.lists(JSON, max_size=2), st.none())


@st.composite
def raw_calls(draw):
    raw = [CALL, draw(st.integers(0, 2**53)), draw(OPTIONS), draw(URIS)]
    extra = draw(st.integers(0, 3))
    if extra >= 1:
        raw.append(draw(ARGS))
    if extra >= 2:
        raw.append(draw(KWARGS))
    if extra >= 3:
        raw.append(draw(JSON))  # one too many: CALL has at most six elements
    return raw


@settings(max_examples=600, deadline=None)
@given(raw_calls())
def test_a_call_made_the_short_way_is_what_autobahns_parse_makes(raw):
    made = plain_call(raw, raw[1])
    try:
        parsed = message.Call.parse(raw)
    except Exception:  # ProtocolError, or an assert in autobahn's parse: decode's Violation either way
        assert made is None  # what parse refuses, the short way never takes
        return
    if made is not None:
        assert made.marshal() == parsed.marshal()
        assert (made.timeout, made.receive_progress, made.args, made.kwargs) == (
            parsed.timeout, parsed.receive_progress, parsed.args, parsed.kwargs)


@settings(max_examples=300, deadline=None)
@given(raw_calls())
def test_decode_gives_parses_message_or_refuses_what_parse_refuses(raw):
    try:
        parsed = message.Call.parse(raw)
    except Exception:
        with pytest.raises(Violation):
            decode(json.dumps(raw).encode(), False, 32)
        return
    assert decode(json.dumps(raw).encode(), False, 32).marshal() == parsed.marshal()


def test_a_heartbeat_is_made_the_short_way():
    beat = [CALL, 7, {}, "llmgw.cp.agent.heartbeat", [{"gpus": [{"index": 0}]}]]
    assert plain_call(beat, 7) is not None
    assert plain_call([CALL, 7, {"timeout": 5000}, "a.b", []], 7).timeout == 5000
    assert plain_call([CALL, 7, {"timeout": 5000, "receive_progress": True}, "a.b"], 7) is None  # parse's


NESTED = st.recursive(JSON_LEAF | st.sampled_from(["[", "]]", "{[", "\\\"["]),
                      lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=2),
                      max_leaves=40)


@settings(max_examples=500, deadline=None)
@given(NESTED, st.integers(4, 12))
def test_a_message_deeper_than_the_limit_is_refused_whatever_its_brackets_count(value, limit):
    raw = [message.Publish.MESSAGE_TYPE, 1, {}, "a.b", [value]]
    payload = json.dumps(raw).encode()
    deep = nesting(raw, limit) > limit
    try:
        decode(payload, False, limit)
    except MessageRefused as e:
        assert deep and "nests deeper" in e.why
        return
    assert not deep


def test_a_short_uris_check_is_remembered_and_a_long_ones_is_not():
    inbound._matches.cache_clear()
    assert inbound._valid_uri(CALL, "llmgw.cp.nodes", {})
    assert inbound._valid_uri(CALL, "llmgw.cp.nodes", {})
    assert inbound._matches.cache_info().hits == 1
    long = "a." * 200 + "b"
    assert inbound._valid_uri(CALL, long, {})
    assert inbound._matches.cache_info().currsize == 1
    assert not inbound._valid_uri(CALL, "a b." * 100, {})
    assert inbound._matches.cache_info().currsize == 1


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet="ab.# \t\n", max_size=12), st.booleans())
def test_a_remembered_uri_check_is_the_patterns(uri, prefix):
    kind = message.Subscribe.MESSAGE_TYPE if prefix else CALL
    options = {"match": "prefix"} if prefix else {}
    pattern = inbound._PREFIX_URI if prefix else inbound._URI
    expected = bool(pattern.match(uri)) and uri != "" and "\n" not in uri
    assert inbound._valid_uri(kind, uri, options) == expected
    assert inbound._valid_uri(kind, uri, options) == expected  # the second time from memory
