"""Who holds a model's weights — a file or a directory — as placement and `ctl status` count it."""

from __future__ import annotations

from types import SimpleNamespace

from llmgw.agent.weights import InventoryWatch, scan
from llmgw.control import placement
from llmgw.control.weights import held_by_fabric, holders
from llmgw.records import IBAdapter, Inventory, WeightsFile, WeightsReport
from llmgw.weightnames import cache_name, partial_name

LOCAL = "/srv/models/gemma-3-1b.gguf"


def node(node_id: str, paths: list[str], fabric: str | None = None):
    files = [WeightsFile(path=p, size_bytes=1000) for p in paths]
    inventory = Inventory(node_id=node_id, weights=WeightsReport(files=files, fingerprint="f", listed=True),
                          infiniband=[IBAdapter(name="mlx5_0", fabric=fabric)] if fabric else None)
    return SimpleNamespace(id=node_id, inventory=inventory)


def fleet(*nodes):
    return SimpleNamespace(nodes={n.id: n for n in nodes})


def test_a_local_path_is_held_by_the_nodes_that_report_it_however_the_catalog_spells_it():
    nodes = fleet(node("gpu01", [LOCAL]), node("gpu02", ["/srv/models/other.gguf"]),
                  node("gpu03", ["/srv/models/gemma-3-1b.gguf"], fabric="ib-a"))
    assert held_by_fabric(nodes, LOCAL) == {"-": 1, "ib-a": 1}
    assert held_by_fabric(nodes, "/srv//models/./gemma-3-1b.gguf") == {"-": 1, "ib-a": 1}
    assert held_by_fabric(nodes, "/srv/models/absent.gguf") == {}


# -- directory sources: vLLM and SGLang models are directories --

REPO = "hf://Qwen/Qwen3-0.6B"


def scanned(node_id: str, cache, *dirs, fabric: str | None = None):
    """A node whose report is what the agent's own scan and watch make of *cache* and *dirs*."""
    report = InventoryWatch(cache).report(scan([cache, *dirs]))
    inventory = Inventory(node_id=node_id, weights=report,
                          infiniband=[IBAdapter(name="mlx5_0", fabric=fabric)] if fabric else None)
    return SimpleNamespace(id=node_id, inventory=inventory)


def model_dir(path, weights=b"w" * 500):
    path.mkdir(parents=True)
    (path / "config.json").write_text('{"hidden_size": 64}')
    (path / "model.safetensors").write_bytes(weights)


def test_a_fetched_repository_is_held_where_its_directory_is_whole(tmp_path):
    whole, half, empty = (tmp_path / n / "weights" for n in ("whole", "half", "empty"))
    model_dir(whole / cache_name(REPO))
    model_dir(half / partial_name(REPO))  # a fetch cut off part-way
    empty.mkdir(parents=True)
    nodes = fleet(scanned("gpu01", whole, fabric="ib-a"), scanned("gpu02", half, fabric="ib-a"),
                  scanned("gpu03", empty))
    report = nodes.nodes["gpu01"].inventory.weights
    assert [(d.path, d.size_bytes) for d in report.directories] == [(str(whole / cache_name(REPO)), 519)]
    assert nodes.nodes["gpu02"].inventory.weights.directories == []
    assert holders(nodes, REPO) == {"gpu01"}
    assert held_by_fabric(nodes, REPO) == {"ib-a": 1}
    # The same repository with files: patterns is another directory, not held here.
    assert holders(nodes, REPO, ["*.safetensors"]) == frozenset()


def test_a_repository_with_files_patterns_is_held_under_its_own_name(tmp_path):
    cache = tmp_path / "weights"
    model_dir(cache / cache_name(REPO, ["*.json", "*.safetensors"]))
    nodes = fleet(scanned("gpu01", cache))
    assert holders(nodes, REPO, ["*.safetensors", "*.json"]) == {"gpu01"}
    assert holders(nodes, REPO) == frozenset()


def test_an_operators_model_directory_is_held_however_the_catalog_spells_it(tmp_path):
    cache, filer = tmp_path / "weights", tmp_path / "filer"
    cache.mkdir()
    model_dir(filer / "llama-3-8b")
    (filer / "notes").mkdir()
    (filer / "notes" / "readme.txt").write_text("not a model")
    nodes = fleet(scanned("gpu01", cache, filer, fabric="ib-a"), scanned("gpu02", cache, filer, fabric="ib-b"),
                  scanned("gpu03", cache))
    source = str(filer / "llama-3-8b")
    assert holders(nodes, source) == holders(nodes, source.replace("/filer/", "/filer//") + "/") == {"gpu01", "gpu02"}
    assert held_by_fabric(nodes, source) == {"ib-a": 1, "ib-b": 1}
    assert holders(nodes, str(filer / "notes")) == frozenset()  # no config.json: not a model


def test_a_held_directory_is_preferred_and_exempt_from_the_disk_check(tmp_path):
    cache = tmp_path / "weights"
    model_dir(cache / cache_name(REPO))
    empty = tmp_path / "empty"
    empty.mkdir()
    nodes = fleet(scanned("gpu01", empty), scanned("gpu02", cache))
    held = holders(nodes, REPO)
    snapshots = [placement.NodeSnapshot(id=n.id, engines=["vllm"], memory_total_bytes=64 << 30,
                                        weights_free_bytes=1 << 30, holds_weights=n.id in held)
                 for n in nodes.nodes.values()]
    request = placement.PlacementRequest(model="qwen", engine="vllm", disk_gb=16)
    chosen = placement.place(request, snapshots, held)
    assert not isinstance(chosen, placement.Unplaceable), chosen
    assert [r.node_id for r in chosen.ranks] == ["gpu02"]
