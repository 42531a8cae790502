"""How a stream the engine stalled ends for the client: an OpenAI error event where its framing has room, else nothing."""

from __future__ import annotations

import json

import pytest

from llmgw.http11 import LAST_CHUNK, chunk
from llmgw.router.deadlines import stall_event
from llmgw.router.response import CHUNKED, LENGTH, UNTIL_CLOSE

WHY = "the engine serving echo stopped sending its answer for 120 s; it is cut short here"
EVENT = chunk(b'data: {"choices": []}\n\n')


def said(event: bytes) -> dict:
    assert event.startswith(b"data: ") and event.endswith(b"\n\n"), event
    return json.loads(event[len(b"data: "):])["error"]


def test_a_chunked_stream_stalled_between_events_ends_with_an_error_chunk_and_the_last_chunk():
    final, close = stall_event(WHY, True, CHUNKED, b"HTTP/1.1 200 OK\r\n\r\n" + EVENT, dechunk=False, between_chunks=True)
    assert final.endswith(LAST_CHUNK) and not close
    event = final[final.index(b"\r\n") + 2:-len(b"\r\n" + LAST_CHUNK)]
    assert final == chunk(event) + LAST_CHUNK
    assert said(event) == {"message": WHY, "type": "server_error", "param": None, "code": "upstream_timeout"}


def test_a_client_reading_it_unchunked_gets_the_bare_event_and_the_connection_closes():
    final, close = stall_event(WHY, True, CHUNKED, EVENT, dechunk=True, between_chunks=True)
    assert said(final)["message"] == WHY and close


@pytest.mark.parametrize("tail", [b"da", b"\r\n"])
def test_a_stream_framed_until_close_ends_with_the_event_only_after_a_whole_event(tail):
    whole = b'data: {"choices": []}\n\n'
    assert stall_event(WHY, True, UNTIL_CLOSE, whole, dechunk=False, between_chunks=False)[1] is True
    assert stall_event(WHY, True, UNTIL_CLOSE, whole + tail, dechunk=False, between_chunks=False) == (None, False)


@pytest.mark.parametrize(
    ("stream", "framing", "tail", "between_chunks"),
    [
        (True, CHUNKED, EVENT, False),  # inside a chunk
        (True, CHUNKED, chunk(b'data: {"choi'), True),  # between chunks, inside an event
        (True, LENGTH, b'data: {"choices": []}\n\n', False),  # a length leaves no room for more
        (True, None, b"", False),  # no head relayed yet: a 504 instead
        (False, CHUNKED, EVENT, True),  # not a stream: the client expects one JSON body
    ],
)
def test_where_no_event_fits_the_response_is_cut_off(stream, framing, tail, between_chunks):
    assert stall_event(WHY, stream, framing, tail, dechunk=False, between_chunks=between_chunks) == (None, False)
