"""The few text fields the router reads of a ``multipart/form-data`` body (RFC 7578): ``model``, ``stream``.

An audio upload is relayed as the bytes it came in; the router only needs
the model it names.  So the body (already whole, and no larger than
``router.max_body_bytes``) is searched for its boundaries in place: no part
is copied but the small text fields asked for, each at most
``MAX_FIELD_BYTES``, and a part's head at most ``MAX_PART_HEAD_BYTES``.  What
does not follow the RFC is refused with what is wrong, not guessed at: the
router routes (and checks a key's allowlist) by the model it reads, and the
engine answers the model its own parser reads, so whatever two parsers could
read two ways (a boundary or a name given twice, a folded header line, a
parameter found inside another's quoted value) is refused, never resolved.
"""

from __future__ import annotations

import re

MAX_FIELD_BYTES = 1024
MAX_PART_HEAD_BYTES = 8192
MAX_BOUNDARY = 70  # RFC 2046 §5.1.1
# An upload is a file and a few fields; a form of tiny parts is work for nothing.
MAX_PARTS = 1000

_TOKEN = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
# One "; name=value" parameter (RFC 9110 §5.6.6), its value a token or a quoted string.
_PARAM = re.compile(r'[ \t]*;[ \t]*(' + _TOKEN + r')=(?:(' + _TOKEN + r')|"((?:[^"\\\x00-\x08\x0a-\x1f\x7f]|\\[^\x00-\x08\x0a-\x1f\x7f])*)")')
_ESCAPE = re.compile(r"\\(.)")
_FIELD_NAME = re.compile(_TOKEN)


class MalformedMultipart(ValueError):
    """The body is not the multipart/form-data its Content-Type says."""


def is_multipart(content_type: str | None) -> bool:
    return content_type is not None and content_type[:19].lower() == "multipart/form-data"


def boundary_of(content_type: str) -> bytes:
    boundary = _parameters(content_type, len("multipart/form-data"), "the Content-Type").get("boundary")
    if boundary is None:
        raise MalformedMultipart("the Content-Type multipart/form-data names no boundary (boundary=...)")
    if not 1 <= len(boundary) <= MAX_BOUNDARY:
        raise MalformedMultipart("the Content-Type's boundary is %d characters; RFC 2046 allows 1 to %d"
                                 % (len(boundary), MAX_BOUNDARY))
    return boundary.encode("latin-1")


def _parameters(value: str, start: int, where: str) -> dict[str, str]:
    """The ``; name=value`` parameters of a field's ``value`` from ``start``, names in lower case."""
    found: dict[str, str] = {}
    pos = start
    while pos < len(value.rstrip(" \t")):
        match = _PARAM.match(value, pos)
        if match is None:
            raise MalformedMultipart("%s cannot be read as parameters (; name=value) from character %d"
                                     % (where, pos))
        name = match.group(1).lower()
        if name in found:
            raise MalformedMultipart("%s has two %s parameters" % (where, name))
        token, quoted = match.group(2), match.group(3)
        found[name] = token if token is not None else _ESCAPE.sub(r"\1", quoted)
        pos = match.end()
    return found


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
    parts = 0
    while True:
        if body.startswith(b"--", pos):
            return found
        parts += 1
        if parts > MAX_PARTS:
            raise MalformedMultipart("the form has more than %d parts" % MAX_PARTS)
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
        if line[:1] in (" ", "\t"):
            raise MalformedMultipart("a part's header line is folded (starts with white space): RFC 7578 has none")
        field, colon, value = line.partition(":")
        if not colon or _FIELD_NAME.fullmatch(field) is None:
            raise MalformedMultipart("a part's header line %r is not a field" % line[:60])
        if field.lower() == "content-disposition":
            if disposition is not None:
                raise MalformedMultipart("a part has two Content-Disposition fields")
            disposition = value.strip(" \t")
    if disposition is None or disposition[:9].lower() != "form-data":
        raise MalformedMultipart("a part has no Content-Disposition: form-data")
    name = _parameters(disposition, 9, "a part's Content-Disposition").get("name")
    if name is None:
        raise MalformedMultipart("a part's Content-Disposition names no field (name=\"...\")")
    return name
