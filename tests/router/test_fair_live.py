"""Fair shares with real processes: a flood of unread streams from one address does not hold every slot.

A ``twistd llmgw-router`` with four slots in front of a sim that streams as
fast as it can; one client (127.0.0.2) opens eight streams and reads none,
so the router's buffers for them fill and they stall; another (127.0.0.1)
then asks for a short answer.  It holds no slot, so it is next; the unread
streams are cut after ``router.client_stall_s`` because it waits, and it is
answered — long before ``queue_timeout_s`` or ``write_stall_timeout_s``
(both 60 s), which are the only other ways a slot could free.
"""

from __future__ import annotations

import json
import socket

from tests.support.net import read_response
from tests.support.routerproc import RouterProcess
from tests.support.sim import SimProcess
from tests.support.wait import wait_for

FLOOD = 8


def stream_without_reading(port: int, model: str) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.bind(("127.0.0.2", 0))
    s.connect(("127.0.0.1", port))
    body = json.dumps({"model": model, "stream": True, "messages": [{"role": "user", "content": "go on"}]}).encode()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    return s


def test_unread_streams_from_one_address_are_cut_for_another_clients_request(tmp_path):
    sim = SimProcess("--quiet", "--output-tokens", "1000000", "--tokens-per-s", "20000")
    flood: list[socket.socket] = []
    try:
        extra = ("  admission: {max_inflight_per_endpoint: 4, queue: 64, queue_timeout_s: 60}\n"
                 "  clients: {write_stall_timeout_s: 60}\n"
                 "  client_stall_s: 1\n")
        with RouterProcess(tmp_path, {sim.model: sim.base_url}, extra=extra) as router:
            flood = [stream_without_reading(router.port, sim.model) for _ in range(FLOOD)]
            wait_for(lambda: sim.gauge("vllm:num_requests_running") >= 4, 30, "the flood to take the four slots",
                     detail=router.output)
            body = json.dumps({"model": sim.model, "max_tokens": 4,
                               "messages": [{"role": "user", "content": "hi"}]}).encode()
            with socket.create_connection(("127.0.0.1", router.port), timeout=50) as s:
                s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                          b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                status = read_response(s.makefile("rb"))[0]
            assert status == 200, router.output()
            log = router.output()
            assert "router.client_stall_s" in log and "127.0.0.2" in log, log
    finally:
        for s in flood:
            s.close()
        sim.stop()
