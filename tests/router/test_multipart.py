"""The router reads a form's model (and stream) field in place, and says what is wrong with a form it cannot read."""

from __future__ import annotations

import pytest

from llmgw.router.multipart import MAX_FIELD_BYTES, MalformedMultipart, boundary_of, form_fields, is_multipart

CT = "multipart/form-data; boundary=XyZ"
WANTED = frozenset(("model", "stream"))


def part(name: str, value: bytes, extra: bytes = b"") -> bytes:
    return b'--XyZ\r\nContent-Disposition: form-data; name="%s"%s\r\n\r\n%s\r\n' % (name.encode(), extra, value)


def test_the_wanted_fields_are_read_and_the_file_is_skipped():
    body = (part("file", b"--XyZ is not at a line start\r\n--XyZZ", b'; filename="a.wav"\r\nContent-Type: audio/wav')
            + part("model", b"whisper-1") + part("stream", b"true") + part("language", b"en") + b"--XyZ--\r\n")
    assert form_fields(body, CT, WANTED) == {"model": "whisper-1", "stream": "true"}


def test_a_preamble_and_transport_padding_are_allowed():
    body = b"a preamble\r\n" + part("model", b"m").replace(b"--XyZ\r\n", b"--XyZ  \r\n", 1) + b"--XyZ--"
    assert form_fields(body, CT, WANTED) == {"model": "m"}


@pytest.mark.parametrize("content_type, boundary", [
    ('multipart/form-data; boundary="quoted boundary"', b"quoted boundary"),
    ("Multipart/Form-Data; charset=utf-8; BOUNDARY=abc", b"abc"),
])
def test_the_boundary_is_read_quoted_or_not(content_type, boundary):
    assert is_multipart(content_type) and boundary_of(content_type) == boundary


@pytest.mark.parametrize("body, said", [
    (b"no parts here", "never appears in it"),
    (part("model", b"m"), "the closing boundary (--BOUNDARY--) is missing"),
    (b"--XyZ\r\nContent-Disposition: form-data; name=\"model\"\r\n" + b"X-Pad: y\r\n" * 2000, "do not end"),
    (b'--XyZ\r\nContent-Type: text/plain\r\n\r\nm\r\n--XyZ--', "no Content-Disposition: form-data"),
    (b'--XyZ\r\nContent-Disposition: form-data\r\n\r\nm\r\n--XyZ--', "names no field"),
    (b'--XyZ\r\nnot a field\r\n\r\nm\r\n--XyZ--', "is not a field"),
    (b"--XyZ-- \r\n", None),
    (b"--XyZ\n" + part("model", b"m")[7:] + b"--XyZ--", "does not end in CRLF"),
    (part("model", b"a") + part("model", b"b") + b"--XyZ--", "two 'model' fields"),
    (part("model", b"m" * (MAX_FIELD_BYTES + 1)) + b"--XyZ--", "over 1024 bytes"),
    (part("model", b"\xff\xfe") + b"--XyZ--", "not UTF-8"),
])
def test_a_malformed_form_is_refused_saying_what_is_wrong(body, said):
    if said is None:
        assert form_fields(body, CT, WANTED) == {}
        return
    with pytest.raises(MalformedMultipart, match=said.replace("(", r"\(").replace(")", r"\)")):
        form_fields(body, CT, WANTED)


def test_no_boundary_in_the_content_type_is_refused():
    with pytest.raises(MalformedMultipart, match="names no boundary"):
        form_fields(part("model", b"m") + b"--XyZ--", "multipart/form-data", WANTED)


# What one parser reads one way and an engine's (starlette's, cpp-httplib's) another is refused: the router
# routes, and checks a key's allowlist, by the model it reads, and the engine answers the model it reads.
@pytest.mark.parametrize("content_type", [
    "multipart/form-data; xboundary=XyZ; boundary=AbC",  # substring search finds XyZ, a parameter parser AbC
    "multipart/form-data; boundary=XyZ; boundary=AbC",  # first or last
    "multipart/form-data; charset=\"a; boundary=XyZ\"; boundary=AbC",  # inside a quoted value
    "multipart/form-data; boundary=XyZ junk",
    "multipart/form-dataX; boundary=XyZ",
])
def test_a_content_type_read_two_ways_is_refused(content_type):
    with pytest.raises(MalformedMultipart):
        form_fields(part("model", b"m") + b"--XyZ--", content_type, WANTED)


@pytest.mark.parametrize("disposition, read", [
    # The router read the first name, starlette the last: one form, a model for each.
    (b'form-data; name="model"; name="other"', "two name parameters"),
    # A quoted value is one value, whatever it holds.
    (b'form-data; filename="a;name="; name="x"', {}),
    (b'form-data; filename="name=\\"model\\""; name="x"', {}),
    (b'form-data; name=model', {"model": "m"}),
    (b'form-data; name="model"; filename="a \\"quoted\\" name.wav"', {"model": "m"}),
    (b'form-data; name="mod"el"', "cannot be read"),
])
def test_a_content_disposition_is_read_as_parameters(disposition, read):
    body = b"--XyZ\r\nContent-Disposition: %s\r\n\r\nm\r\n--XyZ--" % disposition
    if isinstance(read, dict):
        assert form_fields(body, CT, WANTED) == read
        return
    with pytest.raises(MalformedMultipart, match=read):
        form_fields(body, CT, WANTED)


@pytest.mark.parametrize("head, said", [
    # A folded line continues the one before it for some parsers and is a field of its own for others.
    (b'Content-Disposition: form-data; name="file"\r\n Content-Disposition: form-data; name="model"', "folded"),
    (b'Content-Disposition : form-data; name="model"', "is not a field"),
    (b'Content-Disposition: form-data; name="file"\r\nContent-Disposition: form-data; name="model"',
     "two Content-Disposition"),
])
def test_a_part_head_read_two_ways_is_refused(head, said):
    with pytest.raises(MalformedMultipart, match=said):
        form_fields(b"--XyZ\r\n%s\r\n\r\nm\r\n--XyZ--" % head, CT, WANTED)


def test_a_form_of_more_parts_than_any_upload_has_is_refused():
    from llmgw.router.multipart import MAX_PARTS
    body = part("model", b"m") + part("x", b"") * MAX_PARTS + b"--XyZ--"
    with pytest.raises(MalformedMultipart, match="more than %d parts" % MAX_PARTS):
        form_fields(body, CT, WANTED)
    assert form_fields(part("model", b"m") + part("x", b"") * (MAX_PARTS - 1) + b"--XyZ--", CT, WANTED) == {"model": "m"}
