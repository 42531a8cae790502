"""The simulator's HTTP/1.1 over raw sockets: bad input, limits, pipelining, chunked bodies."""

from __future__ import annotations

import json

import pytest

from tests.support.net import connect, post, read_response, sse_events
from tests.support.sim import MODEL

CHAT = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "one two three"}], "max_tokens": 3}).encode()


def assert_closed(s) -> None:
    """The simulator closed the connection: a read sees the end, not a timeout."""
    assert s.recv(1) == b""


def openai_error(body: bytes) -> dict:
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


@pytest.mark.parametrize(
    "raw",
    [
        b"GARBAGE\r\n\r\n",
        b"GET /health\r\n\r\n",
        b"GET  /health HTTP/1.1\r\n\r\n",
        b"GET /health HTTP/1.1\r\nHost sim\r\n\r\n",
        b"GET /health HTTP/1.1\r\nHost : sim\r\n\r\n",
        b"GET /health HTTP/1.1\r\n folded: line\r\n\r\n",
        b"GET /health HTTP/1.1\r\nX: a\nb\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",  # TLS spoken to plain HTTP
    ],
)
def test_a_malformed_head_gets_400_and_the_connection_closes(sim, raw):
    with connect(sim.port) as s:
        s.sendall(raw)
        f = s.makefile("rb")
        status, headers, body = read_response(f)
        assert status == 400
        assert headers["connection"] == "close"
        assert openai_error(body)["type"] == "invalid_request_error"
        assert f.read() == b""


def test_a_body_over_the_limit_gets_413_before_it_is_sent(sim):
    with connect(sim.port) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: sim\r\nContent-Length: 1000000000\r\n\r\n")
        status, headers, _ = read_response(s.makefile("rb"))
        assert status == 413
        assert headers["connection"] == "close"


def test_a_chunked_body_over_the_limit_gets_413(start_sim):
    small = start_sim("--max-body-bytes", "1000")
    with connect(small.port) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: sim\r\nTransfer-Encoding: chunked\r\n\r\n")
        s.sendall(b"200\r\n" + b"x" * 512 + b"\r\n")
        s.sendall(b"200\r\n" + b"x" * 512 + b"\r\n")
        f = s.makefile("rb")
        status, _, _ = read_response(f)
        assert status == 413
        assert f.read() == b""


def test_headers_over_the_limit_get_431(sim):
    with connect(sim.port) as s:
        s.sendall(b"GET /health HTTP/1.1\r\n" + b"X-Filler: " + b"y" * 70000 + b"\r\n\r\n")
        status, _, _ = read_response(s.makefile("rb"))
        assert status == 431


@pytest.mark.parametrize(
    "fields, status",
    [
        ("Content-Length: 3\r\nTransfer-Encoding: chunked\r\n", 400),
        ("Content-Length: 3\r\nContent-Length: 4\r\n", 400),
        ("Content-Length: -3\r\n", 400),
        ("Transfer-Encoding: gzip\r\n", 400),
        ("Transfer-Encoding: gzip, chunked\r\n", 501),
    ],
)
def test_ambiguous_framing_is_refused(sim, fields, status):
    with connect(sim.port) as s:
        s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: sim\r\n{fields}\r\nabc".encode())
        f = s.makefile("rb")
        assert read_response(f)[0] == status
        assert f.read() == b""


def test_malformed_json_is_a_400_in_openai_format_and_the_connection_stays(sim):
    with connect(sim.port) as s:
        f = s.makefile("rb")
        s.sendall(post("/v1/chat/completions", b'{"model": "sim-test", "messages": ['))
        status, headers, body = read_response(f)
        assert status == 400
        assert "connection" not in headers
        error = openai_error(body)
        assert "not valid JSON" in error["message"]
        s.sendall(post("/v1/chat/completions", b"[1, 2]"))
        status, _, body = read_response(f)
        assert status == 400
        assert "JSON object" in openai_error(body)["message"]
        s.sendall(post("/v1/chat/completions", b"\xff\xfe\x00"))
        assert read_response(f)[0] == 400
        # Same connection, a good request now.
        s.sendall(post("/v1/chat/completions", CHAT))
        status, _, body = read_response(f)
        assert status == 200
        assert json.loads(body)["choices"][0]["message"]["content"] == "one two three"


def test_an_unknown_path_is_a_404_in_openai_format(sim):
    status, _, body = sim.request("POST", "/v1/assistants", b"{}")
    assert status == 404
    assert openai_error(body)["message"] == "Invalid URL (POST /v1/assistants)"


def test_a_wrong_method_is_a_405_that_says_which(sim):
    status, headers, body = sim.request("DELETE", "/v1/chat/completions")
    assert status == 405
    assert headers["allow"] == "POST"
    assert "accepts POST" in openai_error(body)["message"]


def test_pipelined_requests_are_answered_in_order(sim):
    embed = json.dumps({"model": MODEL, "input": "a b", "encoding_format": "float"}).encode()
    stream = json.dumps({"model": MODEL, "prompt": "p q", "max_tokens": 2, "stream": True}).encode()
    with connect(sim.port) as s:
        s.sendall(
            post("/v1/chat/completions", CHAT)
            + b"GET /v1/models HTTP/1.1\r\nHost: sim\r\n\r\n"
            + post("/v1/completions", stream)
            + post("/v1/embeddings", embed)
            + b"GET /health HTTP/1.1\r\nHost: sim\r\nConnection: close\r\n\r\n"
        )
        f = s.makefile("rb")
        answers = [read_response(f) for _ in range(5)]
        assert f.read() == b""
    assert [a[0] for a in answers] == [200] * 5
    assert json.loads(answers[0][2])["object"] == "chat.completion"
    assert json.loads(answers[1][2])["object"] == "list"
    assert sse_events(answers[2][2])[-1] == "[DONE]"
    assert json.loads(answers[3][2])["data"][0]["object"] == "embedding"
    assert json.loads(answers[4][2]) == {"status": "ok"}
    assert answers[4][1]["connection"] == "close"


def test_pipelining_keeps_order_when_the_first_answer_waits(start_sim):
    slow = start_sim("--ttft-ms", "300")
    with connect(slow.port) as s:
        s.sendall(post("/v1/chat/completions", CHAT) + b"GET /v1/models HTTP/1.1\r\nHost: sim\r\n\r\n")
        f = s.makefile("rb")
        first, second = read_response(f), read_response(f)
    assert json.loads(first[2])["object"] == "chat.completion"
    assert json.loads(second[2])["object"] == "list"


def test_a_chunked_request_body_is_read(sim):
    with connect(sim.port) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: sim\r\nTransfer-Encoding: chunked\r\n\r\n")
        for i in range(0, len(CHAT), 7):
            piece = CHAT[i : i + 7]
            s.sendall(b"%x;ext=1\r\n%b\r\n" % (len(piece), piece))
        s.sendall(b"0\r\nX-Trailer: yes\r\n\r\n")
        status, _, body = read_response(s.makefile("rb"))
    assert status == 200
    assert json.loads(body)["choices"][0]["message"]["content"] == "one two three"


def test_expect_100_continue_gets_the_interim_response(sim):
    with connect(sim.port) as s:
        s.sendall(post("/v1/chat/completions", b"", headers={"Expect": "100-continue", "Content-Length": str(len(CHAT))}))
        f = s.makefile("rb")
        assert read_response(f)[0] == 100
        s.sendall(CHAT)
        assert read_response(f)[0] == 200


def test_http_1_0_closes_unless_kept_alive_and_streams_without_chunks(sim):
    stream = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True}).encode()
    with connect(sim.port) as s:
        s.sendall(b"GET /health HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        f = s.makefile("rb")
        status, headers, _ = read_response(f)
        assert (status, headers["connection"]) == (200, "keep-alive")
        s.sendall(b"POST /v1/chat/completions HTTP/1.0\r\nConnection: keep-alive\r\nContent-Length: %d\r\n\r\n%b" % (len(stream), stream))
        status, headers, body = read_response(f)
        assert "transfer-encoding" not in headers
        assert headers["connection"] == "close"
        assert sse_events(body)[-1] == "[DONE]"


def test_a_streamed_response_is_chunked_server_sent_events(sim):
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi there"}], "max_tokens": 3, "stream": True}).encode()
    with connect(sim.port) as s:
        s.sendall(post("/v1/chat/completions", body))
        status, headers, raw = read_response(s.makefile("rb"))
    assert status == 200
    assert headers["content-type"] == "text/event-stream"
    assert headers["transfer-encoding"] == "chunked"
    events = sse_events(raw)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "hi there hi"
