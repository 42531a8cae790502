"""The fleet's states, driven by a test clock: ready while heartbeats arrive, then unreachable, then lost."""

from __future__ import annotations

import attrs
import pytest
from twisted.internet.task import Clock

from llmgw.control.fleet import Fleet, NotRegistered
from llmgw.records import GPU, EngineInfo, Heartbeat, Inventory
from llmgw.states import EngineState, NodeState


@pytest.fixture
def events():
    return []


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def fleet(clock, events):
    return Fleet(clock, lambda kind, ident, event: events.append((kind, ident, event)),
                 unreachable_after=15, lost_after=60)


def inventory(**kw):
    return Inventory(node_id="node01", address="10.0.0.5", memory_total_bytes=32_000_000_000, **kw)


def test_register_makes_a_ready_node_and_says_so(fleet, events):
    fleet.register("node01", 7, inventory())
    assert fleet.nodes["node01"].state == NodeState.READY
    kind, ident, event = events[-1]
    assert (kind, ident, event.change) == ("node", "node01", "registered")
    assert event.node.state == NodeState.READY and event.node.address == "10.0.0.5"


def test_silence_makes_a_node_unreachable_then_lost(fleet, clock, events):
    fleet.register("node01", 7, inventory())
    clock.advance(14)
    fleet.check()
    assert fleet.nodes["node01"].state == NodeState.READY
    clock.advance(2)
    fleet.check()
    assert fleet.nodes["node01"].state == NodeState.UNREACHABLE
    assert fleet.nodes["node01"].reason == "no heartbeat for 16 s"
    clock.advance(44)
    fleet.check()
    assert fleet.nodes["node01"].state == NodeState.LOST
    assert [e[2].node.state for e in events if e[2].change == "state"] == [NodeState.UNREACHABLE, NodeState.LOST]
    # checking again changes nothing and emits nothing
    before = len(events)
    fleet.check()
    assert len(events) == before


def test_a_heartbeat_brings_an_unreachable_node_back(fleet, clock):
    fleet.register("node01", 7, inventory())
    clock.advance(20)
    fleet.check()
    assert fleet.nodes["node01"].state == NodeState.UNREACHABLE
    fleet.heartbeat("node01", 7, Heartbeat(memory_available_bytes=1))
    assert fleet.nodes["node01"].state == NodeState.READY
    assert fleet.nodes["node01"].reason is None


def test_a_closed_link_makes_the_node_unreachable_at_once(fleet):
    fleet.register("node01", 7, inventory())
    fleet.link_closed(8)  # someone else's session
    assert fleet.nodes["node01"].state == NodeState.READY
    fleet.link_closed(7)
    assert fleet.nodes["node01"].state == NodeState.UNREACHABLE
    assert "link" in fleet.nodes["node01"].reason


def test_a_node_checked_late_goes_from_ready_straight_to_lost(fleet, clock, events):
    fleet.register("node01", 7, inventory())
    clock.advance(61)
    fleet.check()
    assert fleet.nodes["node01"].state == NodeState.LOST
    assert [e[2].node.state for e in events if e[2].change == "state"] == [NodeState.LOST]


def test_a_lost_node_that_registers_again_is_ready_and_a_closed_link_does_not_make_it_unreachable(fleet, clock):
    fleet.register("node01", 7, inventory())
    fleet.link_closed(7)
    clock.advance(61)
    fleet.check()
    fleet.link_closed(7)
    assert fleet.nodes["node01"].state == NodeState.LOST
    fleet.register("node01", 8, inventory())
    assert fleet.nodes["node01"].state == NodeState.READY and fleet.nodes["node01"].state_since == 61


def test_heartbeat_updates_live_figures_and_keeps_what_it_did_not_send(fleet):
    fleet.register("node01", 7, inventory(gpus=[GPU(index=0, memory_used_bytes=1)]))
    fleet.heartbeat("node01", 7, Heartbeat(memory_available_bytes=5_000_000_000))
    node = fleet.nodes["node01"].inventory
    assert node.memory_available_bytes == 5_000_000_000
    assert node.memory_total_bytes == 32_000_000_000  # not in this beat: kept, not zeroed
    assert node.gpus == [GPU(index=0, memory_used_bytes=1)]


def test_a_heartbeat_from_an_unknown_or_stale_session_asks_for_register(fleet):
    with pytest.raises(NotRegistered):
        fleet.heartbeat("node01", 7, Heartbeat())
    fleet.register("node01", 7, inventory())
    with pytest.raises(NotRegistered):
        fleet.heartbeat("node01", 99, Heartbeat())


def test_memory_changes_are_logged(fleet, capture_log):
    fleet.register("node01", 7, inventory())
    fleet.heartbeat("node01", 7, Heartbeat(memory_total_bytes=64_000_000_000))
    assert any("memory changed from 32.0 GB to 64.0 GB" in line for line in capture_log)


def test_a_nodes_engines_are_logged_once_per_change_not_per_heartbeat(fleet, capture_log):
    absent = EngineInfo("vllm", state=EngineState.ABSENT, reason="not in the catalog's engines, nor in agent.yaml")
    installing = [EngineInfo("llama.cpp", "b6000", state=EngineState.INSTALLING,
                             reason="downloading llama-b6000-bin-ubuntu-x64.tar.gz (16 MB)"), absent]
    installed = [EngineInfo("llama.cpp", "b6000", state=EngineState.INSTALLED, origin="server.yaml"), absent]
    fleet.register("node07", 7, Inventory(node_id="node07", engines=installing))
    fleet.heartbeat("node07", 7, Heartbeat(engines=installing))
    # The download moves on, in the node's words: not a change worth a line.
    fleet.heartbeat("node07", 7, Heartbeat(engines=[attrs.evolve(installing[0], reason="downloading … 12/16 MB"),
                                                    absent]))
    fleet.heartbeat("node07", 7, Heartbeat())
    fleet.heartbeat("node07", 7, Heartbeat(engines=installed))
    fleet.heartbeat("node07", 7, Heartbeat(engines=installed))
    fleet.register("node07", 8, Inventory(node_id="node07", engines=installed))
    assert [line for line in capture_log if " engines: " in line] == [
        "node07 engines: llama.cpp b6000 installing (downloading llama-b6000-bin-ubuntu-x64.tar.gz (16 MB)); "
        "vllm absent (not in the catalog's engines, nor in agent.yaml)",
        "node07 engines: llama.cpp b6000 installed; vllm absent (not in the catalog's engines, nor in agent.yaml)",
    ]


def test_views_show_absent_as_none(fleet):
    fleet.register("node01", 7, Inventory(node_id="node01"))
    (view,) = fleet.views()
    assert view.id == "node01" and view.state == NodeState.READY
    assert view.memory_total_bytes is None and view.gpus is None and view.filesystems is None


@pytest.fixture
def capture_log():
    from twisted.logger import formatEvent, globalLogPublisher

    lines: list[str] = []

    def observer(event):
        lines.append(formatEvent(event))

    globalLogPublisher.addObserver(observer)
    yield lines
    globalLogPublisher.removeObserver(observer)
