"""Elastic replicas end to end (docs/scaling.rst): models that sleep, wake on a request, grow and make room.

The server, agents, sim engines and router worker are real processes on
127.0.0.1; every client is the official openai package.  Capacity is fake
GPUs (tests/support/elastic.py): a ``gpus: 4`` profile fits two replicas on
a node of eight.
"""

from __future__ import annotations

import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from tests.support.elastic import (
    client, count_ready, events, hub_router, models_listed, replicas, start_fleet, timed_chat, wait_ready_count,
)
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

MODELS = [f"m{i}" for i in range(1, 7)]

# Six models that sleep until asked; two fit a node, four the fleet.
SIX = """
profiles:
  half-node:
    engine: sim
    gpus: 4
    args: ["--ttft-ms", "0", "--output-tokens", "4", "--startup-delay-ms", "300"]
    scale: {idle_s: 3600, cold_start_timeout_s: 90}
models:
""" + "".join(f"  {m}: {{profile: half-node, replicas: {{min: 0, max: 1}}}}\n" for m in MODELS)


def test_six_sleeping_models_on_room_for_four_answer_in_turn_and_the_least_recently_used_makes_room(cluster):
    start_fleet(cluster, SIX)
    wait_for(lambda: sorted(r["model"] for r in replicas(cluster) if r["state"] == "sleeping") == MODELS, 30,
             "all six models asleep", interval=0.3)
    assert models_listed(cluster.api) == MODELS  # asleep, and listed

    for model in MODELS:
        text, _ = timed_chat(cluster.api, model, "six models")
        assert text == "six models six models"

    # m5 took m1's room and m6 took m2's: the least recently used first.
    evicted = events(cluster, "evicted")
    assert [(e["model"], e["reason"].split(" to make room for ")[1].split(":")[0]) for e in evicted] == [
        ("m1", "m5/0"), ("m2", "m6/0")], evicted
    for entry in evicted:
        assert re.match(r"stopped m\d/0 on node0\d to make room for m\d/0: idle \S+, priority 0 ≤ 0", entry["reason"])
    log = cluster.server.output()
    assert re.search(r"stopped m1/0 on node0\d to make room for m5/0: idle", log), log[-3000:]
    assert re.search(r"stopped m2/0 on node0\d to make room for m6/0: idle", log)

    def settled():
        views = {r["model"]: r for r in replicas(cluster)}
        return views if sorted(m for m, r in views.items() if r["state"] == "ready") == ["m3", "m4", "m5", "m6"] \
            and all(views[m]["state"] == "sleeping" for m in ("m1", "m2")) else None

    views = wait_for(settled, 60, "m3-m6 ready and m1, m2 asleep", interval=0.3)
    assert "evicted to make room" in views["m1"]["reason"], views["m1"]
    table = cluster.ctl("replicas").stdout
    assert "m1/0" in table and "sleeping" in table and "evicted to make room" in table, table

    # The evicted one wakes again when asked, making room in its turn (m3, now the least recently used).
    text, _ = timed_chat(cluster.api, "m1", "back again")
    assert text == "back again back again"
    assert [e["model"] for e in events(cluster, "evicted")][-1] == "m3"


@pytest.mark.slow
def test_an_idle_model_goes_to_zero_and_stays_listed(cluster):
    catalog = """
profiles:
  sim-fast: {engine: sim, args: ["--ttft-ms", "0", "--output-tokens", "2"]}
models:
  nap: {profile: sim-fast, replicas: {min: 0, max: 1}, scale: {idle_s: 3}}
"""
    start_fleet(cluster, catalog, nodes=("node01",))
    text, _ = timed_chat(cluster.api, "nap", "wake up")
    assert text == "wake up"
    # It was woken and was ready (whatever it is by now: idle_s is 3 s, and a loaded machine may take longer
    # than that to ask).
    wait_for(lambda: events(cluster, "ready", "nap"), 30, "nap/0 to be journaled ready", interval=0.3)
    assert events(cluster, "cold start", "nap")

    def asleep():
        (view,) = replicas(cluster, "nap")
        return view["state"] == "sleeping" and view

    view = wait_for(asleep, 30, "nap to be scaled to zero", interval=0.3)
    assert re.match(r"idle: scaled to zero, last request \S+ ago", view["reason"]), view
    table = cluster.ctl("replicas").stdout
    assert "sleeping" in table and "idle: scaled to zero, last request" in table
    assert models_listed(cluster.api) == ["nap"]
    (slept,) = events(cluster, "slept", "nap")
    assert "1 → 0 replica(s): idle: no request for" in slept["reason"]


BURST = """
profiles:
  sim-slow: {engine: sim, args: ["--ttft-ms", "0", "--tokens-per-s", "20", "--output-tokens", "200"]}
models:
  burst:
    profile: sim-slow
    replicas: {min: 1, max: 3}
    scale: {target_inflight: 2, up_after_s: 1, down_after_s: 2, idle_s: 3600}
"""


def expected(prompt: str, tokens: int) -> str:
    """The sim's reply: the prompt's words again and again, *tokens* of them."""
    words = prompt.split()
    return " ".join((words * (tokens // len(words) + 1))[:tokens])


def stream_text(base_url: str, model: str, prompt: str, max_tokens: int) -> str:
    stream = client(base_url, 60).chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], stream=True, max_tokens=max_tokens)
    return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


@pytest.mark.slow
def test_a_burst_grows_a_model_to_its_max_and_it_shrinks_back_while_its_streams_finish(cluster):
    start_fleet(cluster, BURST)
    wait_ready_count(cluster, "burst", 1)
    stop = threading.Event()
    outcomes: list[tuple[str, str | Exception]] = []

    def one(prompt: str, tokens: int) -> None:
        try:
            outcomes.append((expected(prompt, tokens), stream_text(cluster.api, "burst", prompt, tokens)))
        except Exception as e:  # noqa: BLE001 - every failure is counted below
            outcomes.append((prompt, e))

    def keep_asking(worker: int) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            one(f"burst worker {worker} request {n}", 30)  # 1.5 s each

    with ThreadPoolExecutor(max_workers=15) as pool:
        for worker in range(12):
            pool.submit(keep_asking, worker)
        try:
            wait_ready_count(cluster, "burst", 3, timeout=120)
        finally:
            stop.set()
        # Three long streams, one a replica, while the burst ends: below the target, a replica is drained under them.
        long = [pool.submit(one, f"a long stream number {i}", 160) for i in range(3)]  # 8 s each
        wait_for(lambda: any(r["state"] == "draining" for r in replicas(cluster, "burst")), 60,
                 "a replica of burst to be drained", interval=0.2, detail=cluster.logs)
        assert not all(f.done() for f in long), "the long streams ended before the scale-down began"
    failures = [(p, o) for p, o in outcomes if isinstance(o, Exception) or o != p]
    assert not failures, failures[:5]
    assert sum(1 for p, _ in outcomes if p.startswith("a long stream")) == 3  # and whole, as every other

    wait_ready_count(cluster, "burst", 1, timeout=60)
    wait_for(lambda: [r["state"] for r in replicas(cluster, "burst")] == ["ready"], 60,
             "burst back to one replica, the others stopped", interval=0.3)
    assert len(events(cluster, "scaled up", "burst")) >= 2
    downs = events(cluster, "scaled down", "burst")
    assert len(downs) >= 2 and "request(s) in flight or waiting, under 2" in downs[0]["reason"], downs


LAZY = """
profiles:
  sim-loading: {engine: sim, args: ["--ttft-ms", "0", "--output-tokens", "4", "--startup-delay-ms", "1500"]}
models:
  lazy: {profile: sim-loading, replicas: {min: 0, max: 2}, scale: {idle_s: 3600}}
"""


def test_two_routers_asked_at_once_for_a_sleeping_model_start_one_replica(cluster):
    start_fleet(cluster, LAZY)
    worker = hub_router(cluster)
    wait_for(lambda: _listed(worker) == ["lazy"], 60, "the router worker to learn the table", interval=0.3,
             detail=cluster.logs)
    wait_for(lambda: [r["state"] for r in replicas(cluster, "lazy")] == ["sleeping"], 30, "lazy asleep")
    together = threading.Barrier(2)

    def ask(base_url: str) -> str:
        together.wait(timeout=10)
        return timed_chat(base_url, "lazy", "two routers")[0]

    with ThreadPoolExecutor(max_workers=2) as pool:
        answers = list(pool.map(ask, [cluster.api, worker]))
    assert answers == ["two routers two routers"] * 2
    placed = events(cluster, "placed", "lazy")
    assert [e["replica"] for e in placed] == ["lazy/0"], placed
    assert len(events(cluster, "cold start", "lazy")) == 1
    assert [r["replica"] for r in replicas(cluster, "lazy")] == ["lazy/0"]


def _listed(base_url: str) -> list[str] | None:
    try:
        return models_listed(base_url)
    except OSError:
        return None


STUCK = """
profiles:
  sim-stuck: {engine: sim, args: ["--startup-delay-ms", "600000"]}
  sim-fast: {engine: sim, args: ["--ttft-ms", "0", "--output-tokens", "2"]}
models:
  stuck: {profile: sim-stuck, replicas: {min: 0, max: 1}, scale: {cold_start_timeout_s: 2}}
  quick: {profile: sim-fast, replicas: {min: 0, max: 1}}
"""


@pytest.mark.slow
def test_a_request_held_past_the_cold_start_timeout_is_503_naming_what_it_waited_for(cluster):
    start_fleet(cluster, STUCK, nodes=("node01",))
    # Nothing wakes before the fleet has settled after the server's start (fleet.settle_s): one that woke says it has.
    assert timed_chat(cluster.api, "quick", "settled")[0] == "settled settled"
    began = time.monotonic()
    with pytest.raises(openai.APIStatusError) as raised:
        client(cluster.api, 30).chat.completions.create(model="stuck", messages=[{"role": "user", "content": "x"}])
    held = time.monotonic() - began
    error = raised.value
    assert error.status_code == 503 and error.response.headers["retry-after"] == "1"
    assert held >= 2
    message = error.message
    assert "model 'stuck' has no ready replica: held 2 s while the model starts on demand " \
           "(scale.cold_start_timeout_s): " in message, message
    assert "starting on demand: 1 request(s) waiting" in message, message
    (view,) = replicas(cluster, "stuck")
    assert view["state"] == "starting" and view["reason"].startswith("starting on demand: "), view
    assert [e["kind"] for e in events(cluster, model="stuck")][:2] == ["cold start", "placed"]
