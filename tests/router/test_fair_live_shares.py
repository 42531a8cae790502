"""Fair shares between API keys with real processes: a flood does not make a steady key wait; priority goes first.

A ``twistd llmgw-router`` with keys in front of a real sim that generates at
most as many requests at once as the router gives it slots
(``--max-concurrency``), at a set token rate.  The flooding key's streams are
raw sockets that are never read (a small receive buffer, so they stall
soon); the steady key asks with the official ``openai`` client, one request
at a time.  The router's own figures (``llmgw_router_queue_depth``,
``llmgw_router_key_queue_wait_seconds``) are read from its admin listener.
"""

from __future__ import annotations

import hashlib
import json
import socket
import statistics
import time

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.net import connect, free_port, read_response
from tests.support.routerproc import RouterProcess
from tests.support.sim import SimProcess
from tests.support.wait import wait_for

FLOOD_TOKEN, STEADY_TOKEN = "flood-key-token", "steady-key-token"
BATCH_TOKEN, INTERACTIVE_TOKEN = "batch-key-token", "interactive-key-token"


def sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class AdminRouter(RouterProcess):
    """A RouterProcess that also listens on an admin port, for its /metrics."""

    def __init__(self, base, endpoints, extra: str = ""):
        super().__init__(base, endpoints, extra)
        self.admin_port = free_port()
        self.config.write_text(self.config.read_text().replace(
            "admin: null", f'admin: "tcp:{self.admin_port}:interface=127.0.0.1"', 1))

    def metrics(self) -> dict[str, float]:
        with connect(self.admin_port, timeout=5) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            status, _, body = read_response(s.makefile("rb"))
        assert status == 200, body
        samples = {}
        for family in text_string_to_metric_families(body.decode()):
            for sample in family.samples:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
                samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
        return samples

    def queued(self, model: str) -> float:
        return self.metrics().get(f'llmgw_router_queue_depth{{model="{model}"}}', 0.0)


def open_stream(port: int, model: str, token: str | None, rcvbuf: int | None = None,
                source: str = "127.0.0.1") -> socket.socket:
    """A streaming chat completion sent on a new socket from *source*, of which nothing is read yet."""
    s = socket.socket()
    if rcvbuf is not None:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.bind((source, 0))
    s.connect(("127.0.0.1", port))
    body = json.dumps({"model": model, "stream": True, "messages": [{"role": "user", "content": "go on"}]}).encode()
    auth = b"" if token is None else b"Authorization: Bearer %s\r\n" % token.encode()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"%sContent-Length: %d\r\n\r\n%s" % (auth, len(body), body))
    return s


def has_bytes(s: socket.socket) -> bool:
    """Whether the router has sent anything on *s* (nothing is consumed)."""
    s.setblocking(False)
    try:
        return bool(s.recv(1, socket.MSG_PEEK))
    except BlockingIOError:
        return False
    finally:
        s.setblocking(True)


# (a) 100 unread streams of one client against one request at a time of another.
FLOOD = 100
SLOTS = 8
STEADY = 10
CLIENT_STALL_S = 1.0
# An unread stream pauses once the router's 16 KiB buffer, the 16 KiB the kernel may hold unsent
# (stall.limit_unsent) and the client's 4 KiB receive buffer are full: some 0.1 s at TOKENS_PER_S
# (about 200 bytes an event); its client_stall_s clock starts then.  The slack is for a loaded
# 2-core test machine.
TOKENS_PER_S = 1000
FILL_S = 0.5
SLACK_S = 1.5
BOUND_S = CLIENT_STALL_S + FILL_S
# Who floods and who asks one request at a time: two API keys, or, on a router without keys, two addresses.
SHARES = {
    "keys": dict(flood=FLOOD_TOKEN, steady=STEADY_TOKEN, flood_from="127.0.0.1",
                 config=f"  keys: [{{name: flood, sha256: {sha(FLOOD_TOKEN)}}}, "
                        f"{{name: steady, sha256: {sha(STEADY_TOKEN)}}}]\n"),
    "addresses": dict(flood=None, steady="none", flood_from="127.0.0.2", config=""),
}


# The keys' case runs in `make test`; the addresses' (the same machinery, a share per peer) in `make slow`.
@pytest.mark.parametrize("shares", [pytest.param("addresses", marks=pytest.mark.slow), "keys"])
def test_a_flood_of_unread_streams_keeps_another_clients_requests_within_their_fair_share(tmp_path, shares):
    """The bound (docs/router.rst "Fair shares"): the steady client holds no slot while it waits, so its request
    is given the next slot that frees; every slot is held by an unread stream, so that is at most
    client_stall_s after the youngest of them paused.  First come, first served would put each of its
    requests behind the flood's whole queue: up to 92 requests, 8 at a time, a stall each."""
    share = SHARES[shares]
    sim = SimProcess("--quiet", "--output-tokens", "1000000", "--tokens-per-s", str(TOKENS_PER_S),
                     "--max-concurrency", str(SLOTS))
    flood: list[socket.socket] = []
    try:
        extra = (share["config"]
                 + f"  admission: {{max_inflight_per_endpoint: {SLOTS}, queue: 256, queue_timeout_s: 300}}\n"
                 "  clients: {write_stall_timeout_s: 300}\n"
                 f"  client_stall_s: {CLIENT_STALL_S}\n")
        with AdminRouter(tmp_path, {sim.model: sim.base_url}, extra=extra) as router:
            flood = [open_stream(router.port, sim.model, share["flood"], rcvbuf=4096, source=share["flood_from"])
                     for _ in range(FLOOD)]
            wait_for(lambda: router.queued(sim.model) >= FLOOD - 2 * SLOTS and sim.gauge("vllm:num_requests_running") == SLOTS,
                     30, f"the flood to hold the {SLOTS} slots and queue the rest", detail=router.output)
            client = openai.OpenAI(base_url=router.base_url + "/v1", api_key=share["steady"], max_retries=0, timeout=60)
            waits, queued_before = [], []
            for _ in range(STEADY):
                queued_before.append(router.queued(sim.model))
                started = time.monotonic()
                answer = client.chat.completions.create(model=sim.model, max_tokens=4,
                                                        messages=[{"role": "user", "content": "hi"}])
                waits.append(time.monotonic() - started)
                assert answer.choices[0].message.content, answer
            queued_after = router.queued(sim.model)
            metrics = router.metrics()
        cut = metrics[f'llmgw_router_client_stalls_cut_total{{model="{sim.model}"}}']
        queued = ""
        if shares == "keys":
            count = metrics['llmgw_router_key_queue_wait_seconds_count{key="steady"}']
            total = metrics['llmgw_router_key_queue_wait_seconds_sum{key="steady"}']
            queued = f"; router: {count:g} of them queued, {total:.2f} s in all"
        print(f"\n{shares}: {STEADY} requests one at a time against {FLOOD} unread streams on {SLOTS} slots "
              f"(client_stall_s {CLIENT_STALL_S:g}, {TOKENS_PER_S} tokens/s):\n"
              f"  wait per request (s): {' '.join(f'{w:.2f}' for w in waits)}\n"
              f"  p50 {statistics.median(waits):.2f} s, p100 {max(waits):.2f} s; bound {BOUND_S:g} s + {SLACK_S:g} s "
              f"slack{queued}\n  {cut:g} flood streams cut; flood queue before each: {queued_before}, "
              f"after: {queued_after:g}")
        # The flood was there all along: its queue never emptied, so first come first served would
        # have made every request wait for it.
        assert min(queued_before) > 0 and queued_after > 0, (queued_before, queued_after)
        assert max(waits) <= BOUND_S + SLACK_S, (waits, router.output())
    finally:
        for s in flood:
            s.close()
        sim.stop()


# (b) priority: an interactive key's request before a batch key's queue, though it holds more slots.
def test_an_interactive_keys_request_takes_the_next_slot_before_a_batch_keys_queue(tmp_path):
    """Two slots: the interactive key holds one, the batch key the other and queues three more; then the
    interactive key asks again.  The batch key's stream ends: holding none now, it would be next on fair
    shares alone, but priority gives the slot to the interactive request.  Every stream is endless, so the
    slot that frees is the only one, and whoever took it holds it: the test does not race a timer."""
    sim = SimProcess("--quiet", "--output-tokens", "1000000", "--tokens-per-s", "20", "--max-concurrency", "2")
    streams: list[socket.socket] = []

    def stream(token: str) -> socket.socket:
        streams.append(open_stream(router.port, sim.model, token))
        return streams[-1]

    try:
        extra = (f"  keys: [{{name: batch, sha256: {sha(BATCH_TOKEN)}, priority: batch}}, "
                 f"{{name: interactive, sha256: {sha(INTERACTIVE_TOKEN)}}}]\n"
                 "  admission: {max_inflight_per_endpoint: 2, queue: 16, queue_timeout_s: 300}\n"
                 "  clients: {write_stall_timeout_s: 300}\n"
                 "  client_stall_s: null\n")
        with AdminRouter(tmp_path, {sim.model: sim.base_url}, extra=extra) as router:
            held = stream(INTERACTIVE_TOKEN)
            wait_for(lambda: has_bytes(held), 30, "the interactive key's first stream to start", detail=router.output)
            batch_running = stream(BATCH_TOKEN)
            wait_for(lambda: has_bytes(batch_running), 30, "the batch key's stream to start", detail=router.output)
            batch_queued = [stream(BATCH_TOKEN) for _ in range(3)]
            wait_for(lambda: router.queued(sim.model) == 3, 30, "the batch key's three to queue", detail=router.output)
            interactive = stream(INTERACTIVE_TOKEN)
            wait_for(lambda: router.queued(sim.model) == 4, 30, "the interactive request to queue", detail=router.output)
            assert not any(has_bytes(s) for s in batch_queued + [interactive])

            batch_running.close()
            started = wait_for(lambda: [s for s in batch_queued + [interactive] if has_bytes(s)], 30,
                               "a queued request to take the freed slot", detail=router.output)
            assert started == [interactive], "a batch key's queued request took the slot before the interactive key's"
            assert router.queued(sim.model) == 3
            assert sim.gauge("vllm:num_requests_running") == 2
    finally:
        for s in streams:
            s.close()
        sim.stop()
