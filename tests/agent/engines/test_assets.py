"""assets: the llama.cpp release asset each kind of node downloads, and why when it is not the one hoped for."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from llmgw.agent.engines.assets import (
    Asset, NoAsset, Platform, cuda_of_driver, cuda_of_nvml, llama_cpp_asset, this_platform,
)
from llmgw.records import Inventory
from llmgw.wire import from_wire

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"

IDLE = "this node runs the CPU build and its GPUs stay idle for llama.cpp"
NO_CUDA_B6000 = (f"llama.cpp b6000 publishes no CUDA build for Linux: {IDLE}; "
                 "name a CUDA build in agent.yaml engines.llama.cpp.path")

linux_x64 = Platform("linux", "x86_64")
linux_arm = Platform("linux", "aarch64")


@pytest.mark.parametrize("version, platform, asset", [
    # Before the switch to tar.gz, Linux and macOS assets were zips.
    ("b6000", linux_x64, Asset("llama-b6000-bin-ubuntu-x64.zip")),
    ("b7312", linux_x64, Asset("llama-b7312-bin-ubuntu-x64.zip")),
    ("b7313", linux_x64, Asset("llama-b7313-bin-ubuntu-x64.tar.gz")),
    ("b11194", linux_x64, Asset("llama-b11194-bin-ubuntu-x64.tar.gz")),
    ("b6000", Platform("linux", "s390x"), Asset("llama-b6000-bin-ubuntu-s390x.zip")),
    ("b9993", Platform("linux", "s390x", cuda="12.4"), Asset("llama-b9993-bin-ubuntu-s390x.tar.gz")),
    ("b5000", linux_arm, Asset("llama-b5000-bin-ubuntu-arm64.zip")),
    ("b9174", linux_arm, Asset("llama-b9174-bin-ubuntu-arm64.tar.gz")),
    ("b6000", Platform("macos", "arm64"), Asset("llama-b6000-bin-macos-arm64.zip")),
    ("b6000", Platform("macos", "x86_64"), Asset("llama-b6000-bin-macos-x64.zip")),
    ("b11194", Platform("macos", "arm64", cuda="12.4"), Asset("llama-b11194-bin-macos-arm64.tar.gz")),
    # A driver, but no Linux CUDA build in the release: the CPU build, and why.
    ("b6000", Platform("linux", "x86_64", cuda="12.7"), Asset("llama-b6000-bin-ubuntu-x64.zip", note=NO_CUDA_B6000)),
    ("b10964", Platform("linux", "x86_64", cuda="13.4"), Asset(
        "llama-b10964-bin-ubuntu-x64.tar.gz",
        note=f"llama.cpp b10964 publishes no CUDA build for Linux: {IDLE}; "
             "name a CUDA build in agent.yaml engines.llama.cpp.path")),
    ("b10996", Platform("linux", "aarch64", cuda="13.4"), Asset(
        "llama-b10996-bin-ubuntu-arm64.tar.gz",
        note=f"llama.cpp b10996 publishes no CUDA build for Linux arm64: {IDLE}; "
             "name a CUDA build in agent.yaml engines.llama.cpp.path")),
    # The highest CUDA build the driver runs, with its runtime beside it.
    ("b10996", Platform("linux", "x86_64", cuda="13.3"), Asset(
        "llama-b10996-bin-ubuntu-cuda-13.3-x64.tar.gz",
        extras=("cudart-llama-b10996-bin-ubuntu-cuda-13.3-x64.tar.gz",))),
    ("b11194", Platform("linux", "x86_64", cuda="12.9"), Asset(
        "llama-b11194-bin-ubuntu-cuda-12.8-x64.tar.gz",
        extras=("cudart-llama-b11194-bin-ubuntu-cuda-12.8-x64.tar.gz",))),
    ("b11194", Platform("linux", "x86_64", cuda="13.4"), Asset(
        "llama-b11194-bin-ubuntu-cuda-13.4-x64.tar.gz",
        extras=("cudart-llama-b11194-bin-ubuntu-cuda-13.4-x64.tar.gz",))),
    ("b11056", Platform("linux", "aarch64", cuda="13.3"), Asset(
        "llama-b11056-bin-ubuntu-cuda-13.3-arm64.tar.gz",
        extras=("cudart-llama-b11056-bin-ubuntu-cuda-13.3-arm64.tar.gz",))),
    # 12.10 is newer than 12.8, compared as numbers.
    ("b11194", Platform("linux", "x86_64", cuda="12.10"), Asset(
        "llama-b11194-bin-ubuntu-cuda-12.8-x64.tar.gz",
        extras=("cudart-llama-b11194-bin-ubuntu-cuda-12.8-x64.tar.gz",))),
    ("b11194", Platform("linux", "x86_64", cuda="12.4"), Asset(
        "llama-b11194-bin-ubuntu-x64.tar.gz",
        note=f"llama.cpp b11194's Linux CUDA builds need CUDA 12.8 or newer, and this node's NVIDIA driver supports "
             f"CUDA 12.4: {IDLE}; update the driver, or name a CUDA build in agent.yaml engines.llama.cpp.path")),
    ("b11194", Platform("linux", "aarch64", cuda="12.8"), Asset(
        "llama-b11194-bin-ubuntu-arm64.tar.gz",
        note=f"llama.cpp b11194's Linux CUDA builds need CUDA 13.4 or newer, and this node's NVIDIA driver supports "
             f"CUDA 12.8: {IDLE}; update the driver, or name a CUDA build in agent.yaml engines.llama.cpp.path")),
])
def test_the_asset_for_each_platform_and_release(version, platform, asset):
    assert llama_cpp_asset(version, platform) == asset


@pytest.mark.parametrize("version, platform, sentence", [
    ("b6000", Platform("linux", "riscv64"),
     "llama.cpp b6000 publishes no build for linux riscv64: name a build made for this node in agent.yaml "
     "engines.llama.cpp.path"),
    ("b6000", Platform("freebsd", "amd64"),
     "llama.cpp b6000 publishes no build for freebsd amd64: name a build made for this node in agent.yaml "
     "engines.llama.cpp.path"),
    ("b6000", Platform("macos", "ppc"),
     "llama.cpp b6000 publishes no build for macos ppc: name a build made for this node in agent.yaml "
     "engines.llama.cpp.path"),
    ("b6000", Platform("linux", "aarch64", cuda="12.4"),
     "llama.cpp b6000 publishes no build for linux aarch64 (the releases from b5580 to b9173 have none): name a "
     "build in agent.yaml engines.llama.cpp.path, or choose a release from b9174 on"),
    ("latest", linux_x64,
     "llama.cpp 'latest' is not a release tag: llama.cpp's releases are tagged b<number> (such as b6000); "
     "set engines.llama.cpp.version in server.yaml to one"),
])
def test_a_release_with_nothing_for_the_node_says_so(version, platform, sentence):
    with pytest.raises(NoAsset) as caught:
        llama_cpp_asset(version, platform)
    assert str(caught.value) == sentence


def test_a_pinned_name_corrects_the_extension_the_rule_expects():
    # The first tar.gz build is not known: a site that pinned the zip of b7400 gets the zip.
    pinned = {"llama-b7400-bin-ubuntu-x64.zip": "0" * 64}
    assert llama_cpp_asset("b7400", linux_x64) == Asset("llama-b7400-bin-ubuntu-x64.tar.gz")
    assert llama_cpp_asset("b7400", linux_x64, available=pinned) == Asset("llama-b7400-bin-ubuntu-x64.zip")


def test_pinned_cuda_builds_of_a_release_the_table_does_not_know_are_chosen():
    pinned = {"llama-b12000-bin-ubuntu-x64.tar.gz", "llama-b12000-bin-ubuntu-cuda-13.6-x64.tar.gz",
              "cudart-llama-b12000-bin-ubuntu-cuda-13.6-x64.tar.gz", "llama-b12000-bin-ubuntu-cuda-12.9-x64.tar.gz"}
    assert llama_cpp_asset("b12000", Platform("linux", "x86_64", cuda="13.7"), available=pinned) == Asset(
        "llama-b12000-bin-ubuntu-cuda-13.6-x64.tar.gz", extras=("cudart-llama-b12000-bin-ubuntu-cuda-13.6-x64.tar.gz",))
    assert llama_cpp_asset("b12000", Platform("linux", "x86_64", cuda="13.0"), available=pinned).name == (
        "llama-b12000-bin-ubuntu-cuda-12.9-x64.tar.gz")


def test_a_cuda_build_nothing_pins_falls_back_to_a_pinned_cpu_build_and_says_which_digest_to_add():
    pinned = {"llama-b11194-bin-ubuntu-x64.tar.gz"}
    assert llama_cpp_asset("b11194", Platform("linux", "x86_64", cuda="13.4"), available=pinned) == Asset(
        "llama-b11194-bin-ubuntu-x64.tar.gz",
        note=f"server.yaml pins no sha256 for llama-b11194-bin-ubuntu-cuda-13.4-x64.tar.gz: {IDLE}; add its digest, "
             "and its cudart's, under engines.llama.cpp.sha256")


def test_with_nothing_pinned_for_the_node_the_rule_names_the_asset_whose_digest_is_missing():
    pinned = {"llama-b11194-bin-win-cpu-x64.zip"}
    assert llama_cpp_asset("b11194", Platform("linux", "x86_64", cuda="13.4"), available=pinned).name == (
        "llama-b11194-bin-ubuntu-cuda-13.4-x64.tar.gz")


def test_a_pinned_arm64_build_in_the_gap_is_taken_at_its_word():
    pinned = {"llama-b7000-bin-ubuntu-arm64.zip"}
    assert llama_cpp_asset("b7000", linux_arm, available=pinned) == Asset("llama-b7000-bin-ubuntu-arm64.zip")


# -- the CUDA version a driver supports ---------------------------------------

def _recorded_driver_and_cuda() -> list[tuple[str, str, str]]:
    found = []
    for path in sorted((FIXTURES / "hardware").glob("nvidia-smi-*")):
        text = path.read_text()
        driver = re.search(r"Driver Version\s*:\s*(\S+)|<driver_version>([^<]+)<", text)
        cuda = re.search(r"CUDA Version\s*:\s*(\S+)|<cuda_version>([^<]+)<", text)
        if driver and cuda:
            found.append((path.name, driver.group(1) or driver.group(2), cuda.group(1) or cuda.group(2)))
    return found


@pytest.mark.parametrize("recording, driver, cuda", _recorded_driver_and_cuda())
def test_the_cuda_of_a_driver_is_what_nvidia_smi_printed_beside_it(recording, driver, cuda):
    assert cuda_of_driver(driver) == cuda


def test_every_recording_with_a_driver_was_read():
    assert len(_recorded_driver_and_cuda()) == 3


@pytest.mark.parametrize("driver, cuda", [
    (None, None), ("", None), ("390.157", None), ("450.36.06", "11.0"), ("580.65.06", "13.0"),
    # Newer than the table: its newest, a lower bound.
    ("610.10", "13.0"),
])
def test_cuda_of_driver_at_the_edges_of_its_table(driver, cuda):
    assert cuda_of_driver(driver) == cuda


@pytest.mark.parametrize("nvml, cuda", [(12040, "12.4"), (12070, "12.7"), (13000, "13.0"), (11080, "11.8")])
def test_cuda_of_nvml(nvml, cuda):
    assert cuda_of_nvml(nvml) == cuda


# -- every recorded node ------------------------------------------------------

def _inventories() -> list[Inventory]:
    return [from_wire(Inventory, json.loads(p.read_text())) for p in sorted((FIXTURES / "nodes").glob("*.json"))]


def _platform(inv: Inventory) -> Platform:
    # Every recorded machine is an x86_64 Linux host; the recordings do not say
    # so, and the inventories leave arch out rather than guess.
    flags = frozenset(inv.cpu.vector_flags or ()) if inv.cpu else frozenset()
    return Platform("linux", inv.arch or "x86_64", cuda=cuda_of_driver(inv.nvidia_driver), cpu_flags=flags)


EXPECTED = {
    # node: (b6000, b11194)
    "node05": (Asset("llama-b6000-bin-ubuntu-x64.zip"), Asset("llama-b11194-bin-ubuntu-x64.tar.gz")),
    "cpu01": (Asset("llama-b6000-bin-ubuntu-x64.zip"), Asset("llama-b11194-bin-ubuntu-x64.tar.gz")),
    "ws01": (
        Asset("llama-b6000-bin-ubuntu-x64.zip", note=NO_CUDA_B6000),
        Asset("llama-b11194-bin-ubuntu-x64.tar.gz", note=(
            f"llama.cpp b11194's Linux CUDA builds need CUDA 12.8 or newer, and this node's NVIDIA driver supports "
            f"CUDA 12.4: {IDLE}; update the driver, or name a CUDA build in agent.yaml engines.llama.cpp.path")),
    ),
    **{gpu: (
        Asset("llama-b6000-bin-ubuntu-x64.zip", note=NO_CUDA_B6000),
        Asset("llama-b11194-bin-ubuntu-x64.tar.gz", note=(
            f"llama.cpp b11194's Linux CUDA builds need CUDA 12.8 or newer, and this node's NVIDIA driver supports "
            f"CUDA 12.7: {IDLE}; update the driver, or name a CUDA build in agent.yaml engines.llama.cpp.path")),
    ) for gpu in ("gpu01", "gpu02", "gpu03")},
}


def test_every_recorded_node_gets_an_asset_or_a_sentence():
    got = {}
    for inv in _inventories():
        answers = []
        for version in ("b6000", "b11194"):
            try:
                answers.append(llama_cpp_asset(version, _platform(inv)))
            except NoAsset as e:
                answers.append(str(e))
        got[inv.node_id] = tuple(answers)
    assert got == EXPECTED


# -- this node ----------------------------------------------------------------

class _Uname:
    def __init__(self, sysname: str, machine: str) -> None:
        self.sysname, self.machine = sysname, machine

    def __call__(self) -> _Uname:
        return self


def _proc(tmp_path: Path, recording: str) -> str:
    shutil.copy(FIXTURES / "hardware" / recording, tmp_path / "cpuinfo")
    return str(tmp_path)


def test_this_platform_reads_uname_and_the_cpu_flags_llama_cpp_cares_about(tmp_path):
    grace = this_platform("12.8", uname=_Uname("Linux", "aarch64"),
                          proc_root=_proc(tmp_path, "cpuinfo-grace-neoverse-v2-section.txt"))
    assert (grace.system, grace.machine, grace.cuda) == ("linux", "aarch64", "12.8")
    assert {"asimd", "sve", "sve2"} <= grace.cpu_flags and "avx2" not in grace.cpu_flags


@pytest.mark.parametrize("recording, flags", [
    ("cpuinfo-ryzen7-2700x-kvm-guest-avx2.txt", {"sse4_2", "avx", "avx2"}),
    # QEMU's 2.5 CPU model offers nothing past SSE2.
    ("cpuinfo-qemu-virtual-cpu-2.5-no-avx.txt", set()),
])
def test_x86_flags_are_read_from_cpuinfo(tmp_path, recording, flags):
    x86 = this_platform(uname=_Uname("Linux", "x86_64"), proc_root=_proc(tmp_path, recording))
    assert x86 == Platform("linux", "x86_64", cpu_flags=frozenset(flags))


def test_an_unreadable_cpuinfo_is_no_flags_and_darwin_is_macos(tmp_path):
    assert this_platform(uname=_Uname("Linux", "s390x"), proc_root=str(tmp_path)) == Platform("linux", "s390x")
    assert this_platform(uname=_Uname("Darwin", "arm64"), proc_root=str(tmp_path)) == Platform("macos", "arm64")


def test_this_platform_here():
    here = this_platform()
    assert (here.system, here.machine) == ({"Darwin": "macos"}.get(os.uname().sysname, os.uname().sysname.lower()),
                                           os.uname().machine)
