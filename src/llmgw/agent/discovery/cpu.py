"""The processor, as /proc/cpuinfo describes it, and a warning when it lacks AVX2."""

from __future__ import annotations

import os

from llmgw.records import CPU

# The extensions llama.cpp's builds are chosen by, in the order they are reported.
# x86 names from the "flags" line, arm names from "Features".
VECTOR_FLAGS = (
    "sse4_2", "avx", "avx2", "fma", "f16c",
    "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16",
    "asimd", "sve", "sve2",
)

# /proc/cpuinfo on arm names the core only by number; these are the server cores
# a GPU node is likely to have (NVIDIA Grace is a Neoverse V2).  Others are shown
# by number rather than guessed at.
ARM_PARTS = {
    ("0x41", "0xd0c"): "ARM Neoverse-N1",
    ("0x41", "0xd40"): "ARM Neoverse-V1",
    ("0x41", "0xd49"): "ARM Neoverse-N2",
    ("0x41", "0xd4f"): "ARM Neoverse-V2",
    ("0x41", "0xd8e"): "ARM Neoverse-N3",
    ("0x41", "0xd08"): "ARM Cortex-A72",
    ("0x41", "0xd0b"): "ARM Cortex-A76",
    ("0x48", "0xd01"): "HiSilicon Kunpeng-920",
    ("0xc0", "0xac3"): "Ampere AmpereOne",
}


def probe(proc_root: str = "/proc") -> tuple[CPU, list[str]]:
    """This node's CPU and the warnings it should show an operator."""
    try:
        with open(os.path.join(proc_root, "cpuinfo"), encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        # Unreadable is unknown: no flags, and no AVX2 verdict either way.
        return CPU(logical_cores=os.cpu_count()), []
    return parse(text)


def parse(text: str) -> tuple[CPU, list[str]]:
    blocks = [_fields(block) for block in text.split("\n\n") if block.strip()]
    processors = [b for b in blocks if b.get("processor", "").isdigit()]
    first = processors[0] if processors else (blocks[0] if blocks else {})
    # Old arm kernels put "Hardware" and "Model" in a trailing block of their own.
    machine = {k: v for b in blocks for k, v in b.items()}

    if "flags" in first:  # x86 names its extensions "flags"
        flags = set(first["flags"].split())
        x86 = True
    elif "Features" in first:  # arm, "Features"
        flags = set(first["Features"].split())
        x86 = False
    else:
        flags, x86 = None, False

    model = _model(first, machine)
    cpu = CPU(
        model=model,
        # A cpuinfo with no numbered entries (s390, a truncated read) still
        # leaves the count the kernel gives Python.
        logical_cores=len(processors) or os.cpu_count(),
        vector_flags=None if flags is None else [f for f in VECTOR_FLAGS if f in flags],
        # Decided by the flags, never the model name: a hypervisor can hide AVX2
        # from a CPU whose name says it has it.
        avx2=("avx2" in flags) if x86 and flags is not None else None,
    )
    warnings = []
    if cpu.avx2 is False:
        warnings.append(_no_avx2(model, "hypervisor" in flags))
    return cpu, warnings


def _no_avx2(model: str | None, virtual: bool) -> str:
    name = f"CPU {model.split(' @ ')[0]}" if model else "CPU"
    cause = (
        "does this VM's CPU type hide it? host-passthrough shows the real CPU"
        if virtual
        else "an older processor, or a VM CPU type that masks AVX2?"
    )
    return f"{name} has no AVX2: llama.cpp runs several times slower here ({cause})"


def _model(first: dict[str, str], machine: dict[str, str]) -> str | None:
    for key in ("model name", "Hardware", "Model", "cpu model", "uarch"):
        value = first.get(key) or machine.get(key)
        if value:
            return " ".join(value.split())  # cpuinfo pads names with runs of spaces
    implementer, part = first.get("CPU implementer"), first.get("CPU part")
    if part:
        return ARM_PARTS.get((implementer, part), f"CPU part {part}")
    return None


def _fields(block: str) -> dict[str, str]:
    fields = {}
    for line in block.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            # Keys are padded with tabs or, when pasted, with spaces.
            fields.setdefault(key.strip(), value.strip())
    return fields
