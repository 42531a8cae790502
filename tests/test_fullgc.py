"""The server's full garbage collections: on its schedule, or once enough sessions closed; CPython's young ones untouched."""

from __future__ import annotations

import gc

import pytest
from twisted.internet.task import Clock

from llmgw.process.fullgc import FullCollections


@pytest.fixture
def restored():
    saved = gc.get_threshold()
    yield
    gc.set_threshold(*saved)
    gc.unfreeze()


def test_cpython_never_starts_a_full_collection_and_the_schedule_does(restored):
    clock, left, collected = Clock(), [0], []
    full = FullCollections(clock, lambda: left[0], every_s=300, after_left=1000,
                           collect=lambda: collected.append(clock.seconds()) or 0)
    young, middle, _ = gc.get_threshold()
    full.startService()
    assert gc.get_threshold()[:2] == (young, middle)
    assert gc.get_threshold()[2] >= 2**30
    for _ in range(299):
        clock.advance(1)
    assert collected == []
    clock.advance(1)
    assert collected == [300]
    full.stopService()


def test_a_thousand_sessions_closed_bring_the_next_collection_forward(restored):
    clock, left, collected = Clock(), [40], []
    full = FullCollections(clock, lambda: left[0], every_s=300, after_left=1000,
                           collect=lambda: collected.append(clock.seconds()) or 0)
    full.startService()
    clock.advance(10)
    left[0] += 999  # a fleet reconnecting: its old sessions' objects are the garbage
    clock.advance(1)
    assert collected == []
    left[0] += 1
    clock.advance(1)
    assert collected == [12]
    clock.advance(299)
    assert collected == [12]  # the schedule starts again from the last collection
    clock.advance(1)
    assert collected == [12, 312]
    full.stopService()


def test_stopping_gives_cpython_its_thresholds_back(restored):
    before = gc.get_threshold()
    full = FullCollections(Clock(), lambda: 0)
    full.startService()
    full.stopService()
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
