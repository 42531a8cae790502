"""The engine's two deadlines on a request, and how a stream it stalled ends for the client.

Two clocks run against the engine once the request is sent (docs/router.rst,
"Timeouts"): its whole response head must arrive within
``first_byte_timeout_s``, and after that its body must make progress — a
completed chunk when it is chunked, any byte otherwise — at least every
``between_bytes_timeout_s``, except while the client's own slowness holds the
relay paused.  A head that is late is a 504 in OpenAI's shape; a stream that
stalls ends with a final SSE error event where its framing allows one
(``stall_event``), and is cut off where it does not.  Either way the
engine's lease is released as ``upstream_failed``, which counts towards
taking it out of rotation.  ``llmgw.router.proxy.Exchange`` runs the clocks.
"""

from __future__ import annotations

from llmgw.http11 import LAST_CHUNK, chunk
from llmgw.router import errors
from llmgw.router.response import CHUNKED, UNTIL_CLOSE

# A non-streaming answer's head comes when the whole generation is done:
# 300 s is 6,000 tokens at 20 a second.
FIRST_BYTE_TIMEOUT_S = 300.0
# A stream says nothing while the engine prefills a long prompt or waits for
# room in its batch; two minutes is far beyond either on a working engine.
BETWEEN_BYTES_TIMEOUT_S = 120.0
# Which deadline ran out, as ``Metrics.upstream_error`` counts it.
FIRST_BYTE, BETWEEN_BYTES = "first_byte_timeout", "stalled"


def stall_event(message: str, stream: bool, framing: int | None, tail: bytes, dechunk: bool,
                between_chunks: bool) -> tuple[bytes | None, bool]:
    """What ends a stalled stream cleanly for the client, and whether its connection closes after.

    The bytes are an OpenAI error event, framed as the client's response is;
    None where none fits: not a stream, no head relayed yet (*framing* None),
    or the stream stopped inside a chunk or an event.  *tail* is the end of
    what the engine sent; *dechunk* says the client reads the body unchunked
    (HTTP/1.0), so it ends by the connection closing.
    """
    if not stream or framing is None:
        return None, False
    event = b"data: " + errors.error_body("server_error", message, None, errors.GatewayTimeout.code) + b"\n\n"
    if framing == CHUNKED:
        # At a chunk boundary, after the head or a whole event (SSE lines end in LF or CRLF).
        if not between_chunks or not (tail.endswith(b"\n\n\r\n") or tail.endswith(b"\r\n\r\n")):
            return None, False
        if dechunk:
            return event, True
        return chunk(event) + LAST_CHUNK, False
    if framing == UNTIL_CLOSE and (tail.endswith(b"\n\n") or tail.endswith(b"\r\n\r\n")):
        return event, True
    return None, False
