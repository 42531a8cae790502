"""InfiniBand discovery against /sys trees built from ibstat and ibv_devinfo of real adapters."""

from __future__ import annotations

import os

import pytest

from llmgw.agent.discovery import infiniband
from llmgw.records import IBAdapter, IBPort

from .recordings import HARDWARE, SYSFS, ibstat, ibv_devinfo

IBSTAT_TREES = {
    "connectx7-ib-400g": "ibstat-connectx7-ib-400g-mlx5_5-section.txt",
    "connectx7-roce-200g": "ibstat-connectx7-roce-ethernet-section.txt",
    "connectx6dx-roce-100g": "ibstat-connectx6dx-roce-100g.txt",
}


@pytest.mark.parametrize("tree", sorted(IBSTAT_TREES))
def test_reads_what_ibstat_printed(tree):
    printed = ibstat(HARDWARE / IBSTAT_TREES[tree])

    found = infiniband.probe(str(SYSFS / tree))

    assert [a.name for a in found] == sorted(printed)
    for adapter in found:
        ca = printed[adapter.name]
        assert adapter.fw_version == ca["firmware"]
        assert "0x" + adapter.node_guid.replace(":", "") == ca["guid"]
        assert [p.port for p in adapter.ports] == sorted(ca["ports"])
        for port in adapter.ports:
            shown = ca["ports"][port.port]
            assert port.state == shown["State"].upper()  # ibstat: Active; kernel: ACTIVE
            assert port.phys_state == shown["Physical state"]
            assert port.rate_gbps == float(shown["Rate"])
            assert port.link_layer == shown["Link layer"]


def test_reads_what_ibv_devinfo_printed():
    printed = ibv_devinfo(HARDWARE / "ibv_devinfo-2x-connectx3-mlx4.txt")

    found = infiniband.probe(str(SYSFS / "connectx3-mlx4-2x"))

    assert [a.name for a in found] == ["mlx4_0", "mlx4_1"]
    for adapter in found:
        hca = printed[adapter.name]
        assert adapter.node_guid == hca["node_guid"]
        assert adapter.fw_version == hca["fw_ver"]
        assert adapter.board_id == hca["board_id"]
        for port in adapter.ports:
            assert f"PORT_{port.state}" == hca["ports"][port.port]["state"].split()[0]
            assert port.link_layer == hca["ports"][port.port]["link_layer"]
            # ibv_devinfo printed neither, so the tree has neither: unknown, not zero.
            assert port.rate_gbps is None
            assert port.phys_state is None
    assert [p.state for p in found[0].ports] == ["ACTIVE", "DOWN"]


def test_an_adapter_in_full():
    assert infiniband.probe(str(SYSFS / "connectx7-ib-400g"), {"mlx5_5": "ib-a"}) == [
        IBAdapter(
            name="mlx5_5",
            node_guid="9c63:c003:0055:48ae",
            board_id=None,  # ibstat does not print it
            fw_version="28.41.1000",
            ports=[IBPort(port=1, state="ACTIVE", phys_state="LinkUp", rate_gbps=400.0,
                          link_layer="InfiniBand")],
            fabric="ib-a",
        )
    ]


def test_fabric_comes_only_from_configuration():
    found = infiniband.probe(str(SYSFS / "connectx6dx-roce-100g"), {"mlx5_1": "roce-b"})
    assert {a.name: a.fabric for a in found} == {"mlx5_0": None, "mlx5_1": "roce-b"}


def test_sysfs_values_as_ibstatus_printed_them():
    # ibstatus prints the kernel's files verbatim: the parsers meet the real strings.
    lines = (HARDWARE / "ibstatus-connectx-roce-100g-section.txt").read_text().splitlines()
    values = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in lines) if v}
    assert infiniband.parse_state(values["state"]) == "ACTIVE"
    assert infiniband.parse_state(values["phys state"]) == "LinkUp"
    assert infiniband.parse_rate(values["rate"]) == 100.0


@pytest.mark.parametrize("raw, rate", [
    ("2.5 Gb/sec (1X SDR)", 2.5), ("56 Gb/sec (4X FDR)", 56.0), ("", None), ("unknown", None),
])
def test_rates(raw, rate):
    assert infiniband.parse_rate(raw) == rate


def test_no_infiniband_class_is_none_found(tmp_path):
    # Probed, and there is nothing: not the same as "could not look".
    assert infiniband.probe(str(tmp_path)) == []


def test_unreadable_class_is_unknown(tmp_path):
    (tmp_path / "class").mkdir()
    (tmp_path / "class" / "infiniband").write_text("not a directory")
    assert infiniband.probe(str(tmp_path)) is None


@pytest.mark.skipif(not os.path.isdir("/sys/class"), reason="no sysfs here")
def test_this_machine():
    found = infiniband.probe()
    assert isinstance(found, list)
    for adapter in found:
        assert adapter.name and all(p.port >= 1 for p in adapter.ports)
