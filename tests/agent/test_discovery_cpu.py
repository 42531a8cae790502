"""CPU discovery against /proc/cpuinfo recorded on real machines."""

from __future__ import annotations

import os
import platform
import shutil

import pytest

from llmgw.agent.discovery import cpu

from .recordings import HARDWARE

CASES = {
    # file: (model, avx2, vector_flags)
    "cpuinfo-ryzen7-2700x-kvm-guest-avx2.txt": (
        "AMD Ryzen 7 2700X Eight-Core Processor", True, ["sse4_2", "avx", "avx2"],
    ),
    "cpuinfo-core-i7-870-no-avx.txt": (
        "Intel(R) Core(TM) i7 CPU 870 @ 2.93GHz", False, [],
    ),
    "cpuinfo-qemu-virtual-cpu-2.5-no-avx.txt": (
        "QEMU Virtual CPU version 2.5+", False, [],
    ),
    "cpuinfo-i7-10700k-vm-avx-masked-spaces.txt": (
        "Intel(R) Core(TM) i7-10700K CPU @ 3.80GHz", False, ["sse4_2"],
    ),
    "cpuinfo-grace-neoverse-v2-section.txt": (
        "ARM Neoverse-V2", None, ["asimd", "sve", "sve2"],
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_recorded_cpus(name, tmp_path):
    model, avx2, flags = CASES[name]
    shutil.copy(HARDWARE / name, tmp_path / "cpuinfo")

    found, warnings = cpu.probe(proc_root=str(tmp_path))

    assert found.model == model
    assert found.avx2 is avx2
    assert found.vector_flags == flags
    # Each recording is one processor block.
    assert found.logical_cores == 1
    # The warning is there exactly when the node is known to lack AVX2; an arm
    # node has no AVX2 to lack.
    assert bool(warnings) == (avx2 is False)


def test_warning_names_the_cpu_and_the_cost():
    _, warnings = cpu.parse((HARDWARE / "cpuinfo-core-i7-870-no-avx.txt").read_text())
    assert warnings == [
        "CPU Intel(R) Core(TM) i7 CPU 870 has no AVX2: llama.cpp runs several times"
        " slower here (an older processor, or a VM CPU type that masks AVX2?)"
    ]


def test_warning_on_a_vm_says_so():
    # The hypervisor flag is the kernel saying this is a guest: a modern CPU
    # with AVX2 hidden by the VM's CPU type.
    _, warnings = cpu.parse((HARDWARE / "cpuinfo-i7-10700k-vm-avx-masked-spaces.txt").read_text())
    assert warnings[0].startswith("CPU Intel(R) Core(TM) i7-10700K CPU has no AVX2")
    assert "host-passthrough" in warnings[0]


def test_processor_entries_are_counted():
    block = (HARDWARE / "cpuinfo-ryzen7-2700x-kvm-guest-avx2.txt").read_text().strip()
    text = "\n\n".join(block.replace("processor\t: 0", f"processor\t: {n}", 1) for n in range(8))
    found, _ = cpu.parse(text)
    assert found.logical_cores == 8
    assert found.avx2 is True


def test_unreadable_cpuinfo_is_unknown_not_lacking(tmp_path):
    found, warnings = cpu.probe(proc_root=str(tmp_path / "nowhere"))
    assert found.avx2 is None
    assert found.vector_flags is None
    assert found.model is None
    assert found.logical_cores == os.cpu_count()
    assert warnings == []


@pytest.mark.skipif(not os.path.exists("/proc/cpuinfo"), reason="no /proc/cpuinfo here")
def test_this_machine():
    found, warnings = cpu.probe()
    assert found.logical_cores and found.logical_cores >= 1
    if platform.machine() in ("x86_64", "AMD64", "i686"):
        assert found.avx2 in (True, False)
        assert bool(warnings) == (found.avx2 is False)
