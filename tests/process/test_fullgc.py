"""The server's full garbage collections: on its schedule, or once enough sessions closed; CPython's young ones untouched."""

from __future__ import annotations

import gc
import weakref

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


class _Cyclic:
    """An object that only a collection of cycles frees: it refers to itself."""

    def __init__(self):
        self.me = self


def test_what_survives_a_collection_is_frozen_and_a_deep_one_frees_its_cycles(restored):
    clock, left = Clock(), [0]
    full = FullCollections(clock, lambda: left[0], every_s=300, after_left=1000, deep_every_s=3600)
    full.startService()
    kept = _Cyclic()
    alive = weakref.ref(kept)
    clock.advance(300)  # a full collection: kept survives it, and is frozen
    frozen = gc.get_freeze_count()
    assert frozen > 0
    del kept  # now garbage, but only a collection that reads frozen objects finds the cycle
    clock.advance(300)
    assert alive() is not None  # the next full collection read only what arrived since
    left[0] += 1000  # a fleet's worth of sessions closed: their cycles are frozen too
    clock.advance(1)
    assert alive() is None  # the deep collection thawed everything and found it
    assert gc.get_freeze_count() > 0  # and froze what survived it
    full.stopService()


def test_a_deep_collection_comes_at_least_every_deep_every_s(restored):
    """With no session closing, frozen cycles are still found: each deep_every_s everything is read, thawed."""
    clock, collected = Clock(), []
    full = FullCollections(clock, lambda: 0, every_s=300, after_left=1000, deep_every_s=900,
                           collect=lambda: collected.append((clock.seconds(), gc.get_freeze_count())) or 0)
    full.startService()
    for _ in range(1800):
        clock.advance(1)
    assert [at for at, _ in collected] == [300, 600, 900, 1200, 1500, 1800]
    thawed = [at for at, frozen in collected if frozen == 0]
    assert thawed == [900, 1800]
    full.stopService()
