"""The few text fields the router reads of a ``multipart/form-data`` body (RFC 7578): ``model``, ``stream``.

An audio upload is relayed as the bytes it came in; the router only needs
the model it names.  So the body (already whole, and no larger than
``router.max_body_bytes``) is searched for its boundaries in place: no part
is copied but the small text fields asked for, each at most
``MAX_FIELD_BYTES``, and a part's head at most ``MAX_PART_HEAD_BYTES``.  What
does not follow the RFC is refused with what is wrong, not guessed at.
"""

from __future__ import annotations

import re

MAX_FIELD_BYTES = 1024
MAX_PART_HEAD_BYTES = 8192
MAX_BOUNDARY = 70  # RFC 2046 §5.1.1

_BOUNDARY = re.compile(r'''boundary=(?:"([^"]{1,70})"|([^\s;",]{1,70}))''', re.IGNORECASE)
_NAME = re.compile(r'''(?:^|;)\s*name="([^"]*)"''', re.IGNORECASE)


class MalformedMultipart(ValueError):
    """The body is not the multipart/form-data its Content-Type says."""


def is_multipart(content_type: str | None) -> bool:
    return content_type is not None and content_type[:19].lower() == "multipart/form-data"


def boundary_of(content_type: str) -> bytes:
    match = _BOUNDARY.search(content_type)
    if match is None:
        raise MalformedMultipart("the Content-Type multipart/form-data names no boundary (boundary=...)")
    return (match.group(1) or match.group(2)).encode("latin-1")


def form_fields(body: bytes, content_type: str, wanted: frozenset[str]) -> dict[str, str]:
    """The ``wanted`` text fields of the form in ``body``, by name; raises MalformedMultipart saying what is wrong."""
    delimiter = b"--" + boundary_of(content_type)
    # The first delimiter starts the body or a line (a preamble may come before it).
    if body.startswith(delimiter):
        pos = len(delimiter)
    else:
        at = body.find(b"\r\n" + delimiter)
        if at < 0:
            raise MalformedMultipart("the body has no part: its boundary (from Content-Type) never appears in it")
        pos = at + 2 + len(delimiter)
    found: dict[str, str] = {}
    between = b"\r\n" + delimiter
    while True:
        if body.startswith(b"--", pos):
            return found
        # Transport padding (RFC 2046: white space) may follow a delimiter.
        while body[pos:pos + 1] in (b" ", b"\t"):
            pos += 1
        if not body.startswith(b"\r\n", pos):
            raise MalformedMultipart("a boundary line does not end in CRLF")
        pos += 2
        head_end = body.find(b"\r\n\r\n", pos, pos + MAX_PART_HEAD_BYTES + 4)
        if head_end < 0:
            raise MalformedMultipart("a part's header fields do not end (a blank line) within %d bytes"
                                     % MAX_PART_HEAD_BYTES)
        name = _part_name(body[pos:head_end])
        start = head_end + 4
        end = _next_delimiter(body, between, start)
        if name in wanted:
            if name in found:
                raise MalformedMultipart("the form has two %r fields" % name)
            if end - start > MAX_FIELD_BYTES:
                raise MalformedMultipart("the form's %r field is over %d bytes" % (name, MAX_FIELD_BYTES))
            try:
                found[name] = body[start:end].decode("utf-8")
            except UnicodeDecodeError:
                raise MalformedMultipart("the form's %r field is not UTF-8 text" % name) from None
        pos = end + len(between)


def _next_delimiter(body: bytes, between: bytes, start: int) -> int:
    """Where the next CRLF--BOUNDARY that ends a line (or the form) starts."""
    end = body.find(between, start)
    while end >= 0:
        after = body[end + len(between):end + len(between) + 2]
        if after in (b"--", b"\r\n") or after[:1] in (b" ", b"\t"):
            return end
        # Content that starts like the boundary but goes on is content.
        end = body.find(between, end + 1)
    raise MalformedMultipart("the body ends inside a part: the closing boundary (--BOUNDARY--) is missing")


def _part_name(head: bytes) -> str:
    disposition = None
    for line in head.decode("latin-1").split("\r\n"):
        field, colon, value = line.partition(":")
        if not colon:
            raise MalformedMultipart("a part's header line %r is not a field" % line[:60])
        if field.strip().lower() == "content-disposition":
            disposition = value.strip()
    if disposition is None or not disposition.lower().startswith("form-data"):
        raise MalformedMultipart("a part has no Content-Disposition: form-data")
    match = _NAME.search(disposition[len("form-data"):])
    if match is None:
        raise MalformedMultipart("a part's Content-Disposition names no field (name=\"...\")")
    return match.group(1)
