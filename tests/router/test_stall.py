"""The stall clocks, driven by a test clock with stand-in connections: who is cut, when, and who is not."""

from __future__ import annotations

from types import SimpleNamespace

from twisted.internet.task import Clock

from llmgw.router.stall import StallWatch


class Conn:
    """A connection relaying a stream of *model* that holds a slot (a lease) until ``end``."""

    def __init__(self, model="m"):
        self.lost = False
        self.aborted = False
        self.write_stalls = 0
        self.exchange = SimpleNamespace(lease=SimpleNamespace(key=None), info=SimpleNamespace(model=model, request_id="r1"))
        self.transport = SimpleNamespace(getPeer=lambda: SimpleNamespace(host="10.0.0.9", port=5000),
                                         abortConnection=self._abort)

    def _abort(self):
        self.aborted = True
        self.lost = True

    def end(self):
        self.exchange = None

    def write_stalled(self):
        self.write_stalls += 1


def watch(clock, waiting, stall_s=10.0, write_s=30.0, cut=None):
    return StallWatch(clock, lambda: write_s, lambda: stall_s, lambda model: waiting[model],
                      None if cut is None else cut.append)


def test_a_stalled_stream_is_cut_at_client_stall_s_when_a_request_waits_for_its_model():
    clock, waiting, cut = Clock(), {"m": 1}, []
    w = watch(clock, waiting, cut=cut)
    conn = Conn()
    w.paused(conn)
    clock.advance(9.9)
    assert not conn.aborted
    clock.advance(0.1)
    assert conn.aborted and cut == ["m"] and conn not in w


def test_a_stalled_stream_no_one_waits_behind_is_cut_as_soon_as_someone_does():
    clock, waiting = Clock(), {"m": 0}
    w = watch(clock, waiting)
    conn = Conn()
    w.paused(conn)
    clock.advance(20)
    assert not conn.aborted
    waiting["m"] = 1
    w.waited("m")
    assert conn.aborted


def test_a_waiter_for_another_model_cuts_nothing():
    clock, waiting = Clock(), {"m": 0, "other": 1}
    w = watch(clock, waiting)
    conn = Conn()
    w.paused(conn)
    clock.advance(20)
    w.waited("other")
    assert not conn.aborted


def test_a_client_that_reads_again_starts_afresh():
    clock, waiting = Clock(), {"m": 1}
    w = watch(clock, waiting)
    conn = Conn()
    w.paused(conn)
    clock.advance(9)
    w.resumed(conn)
    w.paused(conn)
    clock.advance(9)
    assert not conn.aborted
    clock.advance(1)
    assert conn.aborted


def test_a_stream_that_ended_while_paused_is_not_cut_and_left_to_the_write_stall_limit():
    clock, waiting = Clock(), {"m": 1}
    w = watch(clock, waiting)
    conn = Conn()
    w.paused(conn)
    conn.end()
    clock.advance(10)
    assert not conn.aborted and conn in w
    clock.advance(20)
    assert conn.write_stalls == 1 and conn not in w


def test_without_client_stall_s_only_the_write_stall_limit_cuts():
    clock, waiting = Clock(), {"m": 5}
    w = watch(clock, waiting, stall_s=None)
    conn = Conn()
    w.paused(conn)
    clock.advance(29)
    w.waited("m")
    assert not conn.aborted and conn.write_stalls == 0
    clock.advance(1)
    assert conn.write_stalls == 1


def test_a_connection_gone_leaves_no_timer_and_no_overdue_entry():
    clock, waiting = Clock(), {"m": 0}
    w = watch(clock, waiting)
    conn = Conn()
    w.paused(conn)
    clock.advance(15)
    w.resumed(conn)  # connectionLost
    assert len(w) == 0 and w._overdue == {} and clock.getDelayedCalls() == []
