"""Who holds a model's weights, as `ctl status` counts it per fabric."""

from __future__ import annotations

from types import SimpleNamespace

from llmgw.control.weights import held_by_fabric
from llmgw.records import IBAdapter, Inventory, WeightsFile, WeightsReport

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
