"""An engine killed or hung mid-answer: every stream goes on on the other replica, and reads as one whole answer.

Real processes: a ``twistd llmgw-router`` with two sim replicas of one model
as static endpoints, 32 streaming clients of 300 tokens each.  The sim's
answers are deterministic (``llmgw.sim.api.reply_text``), so the text each
client read is compared with the uninterrupted answer, word for word.
"""

from __future__ import annotations

import json
import signal

import pytest
import pytest_twisted
from twisted.internet import threads

from llmgw.config.routing import Continuation
from llmgw.sim.api import reply_text
from tests.support.net import connect, post, read_response, sse_events
from tests.support.sim import MODEL
from tests.support.streams import StaticRouter, Stream
from tests.support.wait import until, wait_for

from .routerharness import StaticDispatcher, endpoint_of

STREAMS = 32
TOKENS = 300
WORDS = [f"w{i}" for i in range(37)]
WHOLE = reply_text(WORDS, TOKENS)


def run_with_fault(tmp_path, start_sim, fault, extra: str = "", include_usage: bool = True):
    sims = [start_sim("--tokens-per-s", "60", "--output-tokens", str(TOKENS), "--ttft-ms", "0") for _ in range(2)]
    with StaticRouter(tmp_path, MODEL, [s.base_url for s in sims], extra) as router:
        streams = [Stream(router.port, MODEL, WORDS, TOKENS + 50, include_usage) for _ in range(STREAMS)]
        wait_for(lambda: all(len(s.pieces) >= 10 for s in streams), 30, "every stream to have 10 tokens",
                 detail=lambda: str([len(s.pieces) for s in streams]))
        undo = fault(sims[0])
        for s in streams:
            s.thread.join(60)
        if undo:
            undo()
        return streams, router.process.output()


def assert_whole(streams, include_usage=True):
    for s in streams:
        assert not s.thread.is_alive()
        assert s.errors == [], s.errors
        assert s.done
        assert s.text == WHOLE
        assert len(s.ids) == 1
        if include_usage:
            assert s.usage == {"prompt_tokens": len(WORDS), "completion_tokens": TOKENS,
                               "total_tokens": len(WORDS) + TOKENS}


def test_kill_9_of_one_engine_mid_stream_every_stream_reads_as_one_whole_answer(tmp_path, start_sim):
    streams, log = run_with_fault(tmp_path, start_sim, lambda sim: sim.proc.send_signal(signal.SIGKILL))
    assert_whole(streams)
    assert "continuing it on another replica" in log
    # Half the streams were on the killed engine (least-outstanding spreads them).
    assert log.count("continues on") >= STREAMS // 4


@pytest.mark.slow
def test_a_hung_engine_is_a_stall_and_its_streams_go_on_elsewhere(tmp_path, start_sim):
    def hang(sim):
        sim.proc.send_signal(signal.SIGSTOP)
        return lambda: sim.proc.send_signal(signal.SIGCONT)

    streams, log = run_with_fault(tmp_path, start_sim, hang, "  engines: {between_bytes_timeout_s: 1}\n")
    assert_whole(streams)
    assert "stopped sending its answer" in log
    assert max(s.gap for s in streams) >= 1


@pytest.mark.slow
def test_without_usage_asked_for_the_continued_stream_has_none(tmp_path, start_sim):
    streams, _ = run_with_fault(tmp_path, start_sim, lambda sim: sim.proc.send_signal(signal.SIGKILL),
                                include_usage=False)
    assert_whole(streams, include_usage=False)
    assert all(s.usage is None for s in streams)


@pytest.mark.slow
def test_continuation_off_ends_the_stream_with_an_error_event(tmp_path, start_sim):
    streams, log = run_with_fault(tmp_path, start_sim, lambda sim: sim.proc.send_signal(signal.SIGKILL),
                                  "  continuation: {max_attempts: 0}\n")
    cut = [s for s in streams if s.errors]
    assert cut and len(cut) < STREAMS
    assert all(s.text == WHOLE for s in streams if not s.errors)
    assert "continuing it" not in log


# -- in the reactor, with the dispatcher's every step recorded ---------------------------------

def _stream(port: int, started: list, words: list[str]) -> list[dict]:
    with connect(port) as s:
        s.sendall(post("/v1/chat/completions", {"model": MODEL, "stream": True, "stream_options": {"include_usage": True},
                                                "messages": [{"role": "user", "content": " ".join(words)}]}))
        started.append(True)
        return [json.loads(e) for e in sse_events(read_response(s.makefile("rb"))[2])[:-1]]


@pytest_twisted.ensureDeferred
async def test_the_continuation_takes_a_second_lease_and_the_first_is_released_as_failed(start_sim, make_router):
    dying = start_sim("--tokens-per-s", "20", "--output-tokens", "60")
    other = start_sim("--output-tokens", "60")
    dispatcher = StaticDispatcher([endpoint_of(dying, "dying"), endpoint_of(other, "other")])
    router = make_router(dispatcher)
    router.factory.continuation = Continuation(max_attempts=1)
    words = ["alpha", "beta", "gamma"]
    reading = threads.deferToThread(_stream, router.address, [], words)
    await until(lambda: router.protocols and router.protocols[0].exchange is not None
                and router.protocols[0].exchange.relayed > 600, "some tokens relayed")
    dying.proc.send_signal(signal.SIGKILL)
    events = await reading
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
    assert text == reply_text(words, 60)
    assert {e["id"] for e in events} == {events[0]["id"]}
    assert events[-1]["usage"] == {"prompt_tokens": 3, "completion_tokens": 60, "total_tokens": 63}
    assert dispatcher.events == [("admit", "dying"), ("release", "dying", "upstream_failed"),
                                 ("retry", "dying", "other"), ("admit", "other"), ("release", "other", "ok")]
    assert dispatcher.leases[1].tokens == (3, 60)
    assert router.metrics.upstream_errors == [(MODEL, "dying", "reset")]
