"""Choosing what to stop for room: least recently used first, within priority, never busy, never below min."""

from llmgw.control import evict, placement
from llmgw.records import GPU

GB = 1_000_000_000


def node(node_id, gpus, held):
    """A node with *gpus* GPUs, each replica in *held* holding one."""
    reserved = [placement.Reservation(replica, None, {index}) for index, replica in enumerate(held)]
    return placement.NodeSnapshot(id=node_id, engines=["sim"], gpus=[GPU(index=i, memory_total_bytes=80 * GB)
                                                                   for i in range(gpus)],
                                  gpus_in_use={r for res in reserved for r in res.gpus}, reserved=reserved,
                                  replicas={r.split("/")[0]: 1 for r in held})


def candidate(replica, idle_s, priority=0, inflight=0, waiting=0, spare=1, nodes=("node01",)):
    return evict.Candidate(replica, replica.split("/")[0], nodes, priority, idle_s, inflight, waiting, spare)


REQUEST = placement.PlacementRequest(model="c", engine="sim", gpus=1)


def test_the_least_recently_used_goes_first_and_only_as_many_as_needed():
    nodes = [node("node01", 2, ["a/0", "b/0"])]
    chosen, words = evict.choose(REQUEST, nodes, frozenset(), [candidate("b/0", 60), candidate("a/0", 600)], 0)
    assert [c.replica for c in chosen] == ["a/0"] and words == ""


def test_a_model_never_asked_is_older_than_any():
    nodes = [node("node01", 2, ["a/0", "b/0"])]
    chosen, _ = evict.choose(REQUEST, nodes, frozenset(), [candidate("b/0", None), candidate("a/0", 10_000)], 0)
    assert [c.replica for c in chosen] == ["b/0"]


def test_one_on_a_node_placement_did_not_need_is_given_back():
    # node01's replica is older but a 2-GPU request fits only on node02 once both of its replicas go.
    nodes = [node("node01", 1, ["a/0"]), node("node02", 2, ["b/0", "d/0"])]
    two = placement.PlacementRequest(model="c", engine="sim", gpus=2)
    chosen, _ = evict.choose(two, nodes, frozenset(), [
        candidate("a/0", 900), candidate("b/0", 600, nodes=("node02",)), candidate("d/0", 300, nodes=("node02",))], 0)
    assert sorted(c.replica for c in chosen) == ["b/0", "d/0"]


def test_what_may_not_go_is_named_with_why():
    nodes = [node("node01", 3, ["a/0", "b/0", "d/0"])]
    chosen, words = evict.choose(REQUEST, nodes, frozenset(), [
        candidate("a/0", 600, priority=9), candidate("b/0", 600, inflight=2), candidate("d/0", 600, spare=0)], 5)
    assert chosen == []
    assert words == ("nothing can be stopped to make room: a/0 on node01: priority 9 > 5; "
                     "b/0 on node01: 2 request(s) in flight; d/0 on node01: d is at its min")


def test_a_model_with_requests_waiting_keeps_its_replicas():
    nodes = [node("node01", 1, ["a/0"])]
    chosen, words = evict.choose(REQUEST, nodes, frozenset(), [candidate("a/0", 600, waiting=1)], 0)
    assert chosen == [] and "a/0 on node01: 1 request(s) of a waiting" in words


def test_two_replicas_of_one_model_go_only_down_to_its_min():
    nodes = [node("node01", 2, ["a/0", "a/1"])]
    two = placement.PlacementRequest(model="c", engine="sim", gpus=2)
    chosen, words = evict.choose(two, nodes, frozenset(), [candidate("a/0", 600), candidate("a/1", 600)], 0)
    assert chosen == [] and "a/1 on node01: a is at its min" in words


def test_when_even_all_would_not_do_it_says_so():
    nodes = [node("node01", 1, ["a/0"])]
    four = placement.PlacementRequest(model="c", engine="sim", gpus=4)
    chosen, words = evict.choose(four, nodes, frozenset(), [candidate("a/0", 600)], 0)
    assert chosen == [] and words.startswith("nothing can be stopped to make room: stopping every idle replica "
                                             "would not be enough (a/0)")


def test_without_gives_back_gpus_and_the_count():
    (after,) = evict.without([node("node01", 2, ["a/0", "b/0"])], "a/0", "a")
    assert after.gpus_in_use == frozenset({1}) and [r.replica for r in after.reserved] == ["b/0"]
    assert after.replicas["a"] == 0
