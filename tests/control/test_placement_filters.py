"""Each filter refuses what it should, in words an operator can act on, and nothing else."""

from __future__ import annotations

import attrs
import pytest

from llmgw.control import placement_filters as filters
from llmgw.control.placement import NodeSnapshot, PlacementRequest, Reservation, Unplaceable, place
from llmgw.records import GPU, EngineInfo
from llmgw.sizes import GB
from llmgw.states import EngineState

from .machines import node

QWEN_14B = PlacementRequest("qwen2.5-coder-14b", "llama.cpp", min_memory_gb=24)


def refusal(request: PlacementRequest, *nodes: NodeSnapshot) -> list[str]:
    result = place(request, nodes)
    assert isinstance(result, Unplaceable), result
    return result.lines()


# -- memory --


def test_an_8_gb_node_is_refused_a_24_gb_model_in_its_own_terms():
    assert refusal(QWEN_14B, node("vm-8gb")) == ["node05: has 8 GB of memory, needs 24"]


def test_the_summary_says_why_for_every_node():
    result = place(QWEN_14B, [node("vm-8gb"), node("vm-8gb", node_id="node07", cordoned=True)])
    assert result.summary() == (
        "no node can hold it: node05: has 8 GB of memory, needs 24; node07: is cordoned"
    )


def test_a_node_that_reports_no_memory_is_still_a_candidate():
    # cpu-box's recording has no /proc/meminfo: its agent says nothing, like one
    # older than the field.  An old agent is not a small machine.
    box = node("cpu-box")
    assert box.memory_total_bytes is None
    result = place(QWEN_14B, [node("vm-8gb"), box])
    assert [r.node_id for r in result.ranks] == ["cpu01"]


def test_a_profile_without_a_memory_requirement_fits_any_memory():
    result = place(attrs.evolve(QWEN_14B, min_memory_gb=None), [node("vm-8gb")])
    assert [r.node_id for r in result.ranks] == ["node05"]


def test_exactly_enough_memory_is_enough():
    vm = node("vm-8gb")
    need = vm.memory_total_bytes / 1e9
    assert filters.memory.check(attrs.evolve(QWEN_14B, min_memory_gb=need), vm) is None


@pytest.mark.parametrize(
    "has_bytes, need_gb, said",
    [
        (8_202_149_888, 24, "has 8 GB of memory, needs 24"),  # MemTotal of the RHEL 7.1 box
        (7_500_000_000, 24, "has 7.5 GB of memory, needs 24"),
        (8_202_149_888, 7.5 * 2 + 0.5, "has 8 GB of memory, needs 15.5"),
        # Rounded, 23.9 would read as 24 against 24: more digits instead.
        (23_900_000_000, 24, "has 23.9 GB of memory, needs 24"),
        (23_999_000_000, 24, "has 23.9 GB of memory, needs 24"),
        (8_202_149_888, 8.25, "has 8 GB of memory, needs 8.25"),
        (0, 2, "has 0 GB of memory, needs 2"),
    ],
)
def test_memory_figures_read_as_a_person_says_them(has_bytes, need_gb, said):
    small = NodeSnapshot("n", memory_total_bytes=has_bytes)
    assert filters.memory.check(attrs.evolve(QWEN_14B, min_memory_gb=need_gb), small) == said


# -- state --


@pytest.mark.parametrize("state", ["unreachable", "lost"])
def test_a_node_that_is_not_ready_is_refused(state):
    assert refusal(QWEN_14B, node("cpu-box", node_id="node05", state=state)) == [f"node05: is {state}"]


def test_a_cordoned_node_is_refused():
    assert refusal(QWEN_14B, node("cpu-box", node_id="node05", cordoned=True)) == ["node05: is cordoned"]


def test_a_node_that_is_down_is_refused_for_that_first():
    down = node("vm-8gb", state="unreachable", cordoned=True)
    assert refusal(QWEN_14B, down) == ["node05: is unreachable"]


# -- labels --


def test_node_selector_names_the_label_it_wanted_and_what_the_node_has():
    request = PlacementRequest("llama-70b", "vllm", gpus=8, node_selector={"gpu": "a100"})
    assert refusal(request, node("h100x8-ib-a-1", node_id="node05")) == [
        "node05: label gpu=a100 wanted, has gpu=h100"
    ]
    assert refusal(request, node("cpu-box", node_id="node05")) == [
        "node05: label gpu=a100 wanted, has no label gpu"
    ]


def test_node_selector_keeps_nodes_with_every_label():
    request = PlacementRequest("llama-70b", "vllm", gpus=8, node_selector={"gpu": "h100"})
    result = place(request, [node("h100x8-ib-b-1"), node("rtx4090-workstation")])
    assert [r.node_id for r in result.ranks] == ["gpu03"]


# -- engines --


def test_a_node_without_the_engine_is_refused():
    request = PlacementRequest("llama-70b", "vllm")
    assert refusal(request, node("vm-8gb")) == ["node05: has no vllm engine"]


def test_a_node_that_has_no_engines_at_all_is_refused():
    bare = attrs.evolve(node("cpu-box", node_id="node05"), engines=[])
    assert refusal(PlacementRequest("gemma", "llama.cpp"), bare) == ["node05: has no llama.cpp engine"]


def test_a_node_with_no_entry_for_the_engine_says_what_it_was_told():
    installing = attrs.evolve(
        node("cpu-box", node_id="node05"),
        engines=[],
        engines_reason="installing: downloading llama-b6000-bin-ubuntu-x64.tar.gz (16 MB)",
    )
    assert refusal(PlacementRequest("gemma", "llama.cpp"), installing) == [
        "node05: installing: downloading llama-b6000-bin-ubuntu-x64.tar.gz (16 MB)"
    ]


I, B, A = EngineState.INSTALLING, EngineState.BROKEN, EngineState.ABSENT
DOWNLOADING = "downloading llama-b6000-bin-ubuntu-x64.tar.gz (16 MB)"
LIBGOMP = "needs libgomp.so.1, which this node does not have: apt-get install libgomp1"


@pytest.mark.parametrize("entries, version, words", [
    ([EngineInfo("llama.cpp", "b6000", state=I, reason=DOWNLOADING)], "b6000",
     "installing: downloading llama-b6000-bin-ubuntu-x64.tar.gz (16 MB)"),
    ([EngineInfo("llama.cpp", "b6000", state=B, reason=LIBGOMP)], "b6000",
     "llama.cpp broken: needs libgomp.so.1, which this node does not have: apt-get install libgomp1"),
    ([EngineInfo("llama.cpp", "b5000", state=EngineState.INSTALLED)], "b6000", "has llama.cpp b5000, needs b6000"),
    ([EngineInfo("llama.cpp", "b5000", state=EngineState.INSTALLED),
      EngineInfo("llama.cpp", "b6000", state=I, reason=DOWNLOADING)], "b6000",
     "has llama.cpp b5000, needs b6000: installing"),
    ([EngineInfo("llama.cpp", "b5000", state=EngineState.INSTALLED),
      EngineInfo("llama.cpp", "b6000", state=B, reason=LIBGOMP)], "b6000",
     f"has llama.cpp b5000, needs b6000: broken: {LIBGOMP}"),
    ([EngineInfo("llama.cpp", state=A, reason="not in the catalog's engines, nor in agent.yaml")], "b6000",
     "not in the catalog's engines, nor in agent.yaml"),
    ([EngineInfo("llama.cpp", state=A)], "b6000", "has no llama.cpp engine"),
    ([EngineInfo("sim", "0.1", state=EngineState.INSTALLED, origin="builtin")], None, "has no llama.cpp engine"),
    ([EngineInfo("vllm", state=I, reason="installing: pip install vllm==0.11.0")], None,
     "installing: pip install vllm==0.11.0"),
])
def test_a_node_without_the_wanted_build_is_refused_in_its_own_words(entries, version, words):
    engine = entries[0].name if entries[0].name != "sim" else "llama.cpp"
    bare = attrs.evolve(node("cpu-box", node_id="node07"), engines=entries)
    assert refusal(PlacementRequest("gemma", engine, engine_version=version), bare) == [f"node07: {words}"]


@pytest.mark.parametrize("entry, version", [
    (EngineInfo("llama.cpp", "b6000", state=EngineState.INSTALLED, origin="server.yaml"), "b6000"),
    (EngineInfo("llama.cpp", "b6000", state=EngineState.INSTALLED), None),
    # Named by hand in agent.yaml: taken at whatever version it is.
    (EngineInfo("llama.cpp", "b4000", state=EngineState.INSTALLED, origin="agent.yaml"), "b6000"),
    # An agent older than install states cannot install another build: refusing it would empty its node.
    (EngineInfo("llama.cpp", "4000 (abc)"), "b6000"),
])
def test_a_node_with_a_build_it_may_run_is_a_candidate(entry, version):
    box = attrs.evolve(node("cpu-box"), engines=[EngineInfo("llama.cpp", "b5000", state=B, reason="x"), entry])
    result = place(PlacementRequest("gemma", "llama.cpp", engine_version=version), [box])
    assert [r.node_id for r in result.ranks] == ["cpu01"]


def test_an_agent_too_old_to_name_its_engines_is_not_refused():
    old = attrs.evolve(node("cpu-box"), engines=None)
    result = place(PlacementRequest("llama-70b", "vllm"), [old])
    assert [r.node_id for r in result.ranks] == ["cpu01"]


# -- GPUs --


def test_a_node_with_too_few_free_gpus_says_how_many_it_has():
    h100 = node("h100x8-ib-a-1", node_id="node05", gpus_in_use={0, 1, 2, 3, 4, 5})
    assert refusal(PlacementRequest("m", "vllm", gpus=4), h100) == ["node05: has 2 free GPUs, needs 4"]
    assert refusal(PlacementRequest("m", "llama.cpp", gpus=8), node("rtx4090-workstation")) == [
        "ws01: has 1 free GPU, needs 8"
    ]
    full = node("rtx4090-workstation", gpus_in_use={0})
    assert refusal(PlacementRequest("m", "llama.cpp", gpus=1), full) == ["ws01: has no free GPUs, needs 1"]


def test_a_gpu_refusal_names_the_replicas_holding_the_nodes_cards():
    h100 = node("h100x8-ib-a-1", node_id="node05",
                reserved=[Reservation("echo/0", gpus={0, 1}), Reservation("qwen/1", gpus={2, 3, 4, 5}),
                          Reservation("tiny/0", memory_bytes=GB)])
    assert refusal(PlacementRequest("m", "vllm", gpus=4), h100) == [
        "node05: has 2 free GPUs, needs 4; echo/0 and qwen/1 hold 6 of 8"
    ]
    full = node("rtx4090-workstation", reserved=[Reservation("echo/0", gpus={0})])
    assert refusal(PlacementRequest("m", "llama.cpp", gpus=1), full) == [
        "ws01: has no free GPUs, needs 1; echo/0 holds 1 of 1"
    ]
    # Its other replicas' shards each hold cards of the one replica: named once.
    twice = node("h100x8-ib-a-1", node_id="node05",
                 reserved=[Reservation("big/0", gpus=set(range(4))), Reservation("big/0", gpus={4, 5, 6, 7})])
    assert refusal(PlacementRequest("m", "vllm", gpus=1), twice) == ["node05: has no free GPUs, needs 1; big/0 holds 8 of 8"]
    picky = PlacementRequest("m", "vllm", gpus=2, min_gpu_free_bytes=90 * GB)
    assert refusal(picky, node("h100x8-ib-a-1", node_id="node05", reserved=[Reservation("echo/0", gpus={0})])) == [
        "node05: has no free GPUs with 90 GB free, needs 2; echo/0 holds 1 of 8"
    ]


def test_a_node_without_gpus_is_refused_a_gpu_profile():
    assert refusal(PlacementRequest("m", "llama.cpp", gpus=1), node("vm-8gb")) == ["node05: has no GPUs, needs 1"]


def test_a_node_that_could_not_count_its_gpus_is_refused_a_gpu_profile():
    # Unlike memory: a shard needs real GPU indices, and none were reported.
    unknown = attrs.evolve(node("h100x8-ib-a-1", node_id="node05"), gpus=None)
    assert refusal(PlacementRequest("m", "vllm", gpus=4), unknown) == [
        "node05: did not say how many GPUs it has, needs 4"
    ]


def test_a_cpu_profile_does_not_care_about_gpus():
    unknown = attrs.evolve(node("cpu-box"), gpus=None)
    assert [r.gpus for r in place(PlacementRequest("m", "llama.cpp"), [unknown]).ranks] == [[]]


def test_free_gpu_memory_is_checked_per_card_when_asked_for():
    cards = [
        GPU(0, memory_total_bytes=80_000_000_000, memory_used_bytes=60_000_000_000),
        GPU(1, memory_total_bytes=80_000_000_000, memory_used_bytes=1_000_000_000),
        GPU(2, memory_total_bytes=80_000_000_000, memory_used_bytes=70_000_000_000),
        GPU(3),  # did not report its memory: counted, as a node's unknown memory is
    ]
    busy = NodeSnapshot("node05", engines=["vllm"], gpus=cards)
    request = PlacementRequest("m", "vllm", gpus=3, min_gpu_free_bytes=40_000_000_000)
    assert refusal(request, busy) == ["node05: has 2 free GPUs with 40 GB free, needs 3"]
    result = place(attrs.evolve(request, gpus=2), [busy])
    assert result.ranks[0].gpus == [1, 3]


# -- fabric --


def test_a_node_on_no_fabric_cannot_host_a_multi_rank_replica():
    request = PlacementRequest("m", "llama.cpp", gpus=1, ranks=2)
    assert refusal(request, node("rtx4090-workstation", node_id="node05")) == [
        "node05: is on no InfiniBand fabric; a 2-rank replica needs one"
    ]


def test_fabric_is_counted_after_the_other_filters():
    # Two nodes on ib-a, but one is cordoned: ib-a cannot take two ranks.
    request = PlacementRequest("m", "vllm", gpus=8, ranks=2)
    lines = refusal(request, node("h100x8-ib-a-1"), node("h100x8-ib-a-2", cordoned=True))
    assert lines == [
        "gpu01: is on ib-a, where only 1 node can take a rank and a 2-rank replica needs 2",
        "gpu02: is cordoned",
    ]


def test_every_filter_keeps_what_it_does_not_refuse():
    nodes = [node("vm-8gb"), node("cpu-box"), node("h100x8-ib-a-1")]
    for step in filters.FILTERS:
        kept, reasons = step(QWEN_14B, nodes)
        assert sorted([n.id for n in kept] + list(reasons)) == sorted(n.id for n in nodes)
