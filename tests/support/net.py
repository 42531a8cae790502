"""Ports on 127.0.0.1, and just enough HTTP/1.1 over raw sockets to send a request and see exactly what a server sent."""

from __future__ import annotations

import json
import random
import socket
from pathlib import Path


def _first_ephemeral_port() -> int:
    """The lowest port the kernel picks for an outgoing connection (Linux's default where it cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_EPHEMERAL = _first_ephemeral_port()
# Below the kernel's ephemeral range and above the usual services; 10,000 ports
# at most, fewer where the range starts low.
_FIXED = range(max(10000, _EPHEMERAL - 10000), _EPHEMERAL)
_handed_out: set[int] = set()
_pick = random.Random()


def free_port() -> int:
    """A port nobody listens on now, for a listener yet to start, or a dead endpoint.

    It is drawn from below the kernel's ephemeral range, never from bind(0):
    a port bind(0) hands out can be taken, before the listener starts, as the
    local end of any outgoing connection on the machine (a test's own probe of
    another listener, an agent dialling the hub), and the listener then fails
    with "address already in use".  A port is not handed out twice in one
    process, and is checked free by binding it.
    """
    if len(_FIXED) < 100:
        raise RuntimeError(f"no room below the ephemeral ports (from {_EPHEMERAL}); raise ip_local_port_range's first")
    for _ in range(1000):
        port = _pick.choice(_FIXED)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port in {_FIXED.start}-{_FIXED.stop - 1} after 1,000 tries")


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def connect(port: int, timeout: float = 10) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.settimeout(timeout)
    return s


def post(path: str, body: bytes | dict, headers: dict[str, str] | None = None, version: str = "1.1") -> bytes:
    """A raw POST of *body* (a dict is sent as JSON); *headers* add to or replace the usual ones."""
    if isinstance(body, dict):
        body = json.dumps(body).encode()
    fields = {"Host": "router", "Content-Type": "application/json", "Content-Length": str(len(body)), **(headers or {})}
    return (f"POST {path} HTTP/{version}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields.items()) + "\r\n").encode() + body


def read_response(f) -> tuple[int, dict[str, str], bytes]:
    """One response from a buffered socket file: Content-Length, chunked, or read until close."""
    status_line = f.readline()
    assert status_line.startswith(b"HTTP/1.1 "), f"not a response: {status_line!r}"
    status = int(status_line.split()[1])
    headers: dict[str, str] = {}
    while True:
        line = f.readline()
        assert line.endswith(b"\r\n"), f"truncated head: {line!r}"
        if line == b"\r\n":
            break
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    if status == 100:
        return status, headers, b""
    if "content-length" in headers:
        body = f.read(int(headers["content-length"]))
    elif headers.get("transfer-encoding") == "chunked":
        parts = []
        while True:
            size = int(f.readline().split(b";")[0], 16)
            if size == 0:
                assert f.readline() == b"\r\n"
                break
            parts.append(f.read(size))
            assert f.read(2) == b"\r\n"
        body = b"".join(parts)
    else:
        body = f.read()
    return status, headers, body


def sse_events(body: bytes) -> list[str]:
    """The data of each server-sent event in a body."""
    events = body.decode().split("\n\n")
    assert events[-1] == "", f"the stream does not end with a blank line: {body[-40:]!r}"
    out = []
    for event in events[:-1]:
        assert event.startswith("data: "), event
        out.append(event[len("data: "):])
    return out
