"""One set of checks for every NVML: the fake, once per recorded machine, and the real pynvml.

Buildbot's rule: a fake is only worth having while it behaves like the real
thing, so the same test runs against both.  On a machine without the NVIDIA
driver (CI, this project's development VMs) the real one must come out as "no
cards"; on one with a driver, its real cards meet the same checks as the fakes.
"""

from __future__ import annotations

import ctypes
import json
import os
from typing import Any

import attrs
import pytest

from llmgw.agent.discovery import fakenvml, gpus

from .recordings import HARDWARE, MIB, NVML, nvidia_smi_q, nvidia_smi_q_x

# name: cards the recording holds (0: a node without the driver)
FAKES = {"h100x8": 8, "rtx4090": 1, "a100-mig": 1, "no-driver": 0}


def _nvml_usable() -> bool:
    """Whether this machine has a loaded driver and the library to reach it,
    found without asking NVML, whose answer is what is under test."""
    if not os.path.exists("/proc/driver/nvidia/version"):  # the kernel module's file
        return False
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


DRIVER_LOADED = _nvml_usable()


@attrs.frozen
class Implementation:
    nvml: Any
    # How many cards it must report; None for a real driver, where only the
    # machine knows.
    cards: int | None


@pytest.fixture(params=[*FAKES, "driver-not-loaded", "pynvml"])
def impl(request):
    name = request.param
    if name == "pynvml":
        return Implementation(gpus.import_pynvml(), None if DRIVER_LOADED else 0)
    if name == "driver-not-loaded":
        return Implementation(fakenvml.FakeNVML(init_error="DriverNotLoaded"), 0)
    return Implementation(fakenvml.load(str(NVML / f"{name}.json")), FAKES[name])


# The calls discovery relies on, and how NVML answers them.

def test_init_fails_only_without_a_driver_and_then_nothing_answers(impl):
    nvml = impl.nvml
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as e:
        assert impl.cards == 0, f"NVML failed to start beside a loaded driver: {e!r}"
        assert isinstance(e, (nvml.NVMLError_LibraryNotFound, nvml.NVMLError_DriverNotLoaded))
        with pytest.raises(nvml.NVMLError):
            nvml.nvmlDeviceGetCount()
        return
    try:
        count = nvml.nvmlDeviceGetCount()
        assert isinstance(count, int)
        assert impl.cards in (None, count)
    finally:
        nvml.nvmlShutdown()


def test_cards_answer_like_nvml(impl):
    nvml = impl.nvml
    try:
        nvml.nvmlInit()
    except nvml.NVMLError:
        pytest.skip("no driver: the init test covers it")
    try:
        count = nvml.nvmlDeviceGetCount()
        driver = gpus._text(nvml.nvmlSystemGetDriverVersion())
        assert isinstance(driver, str) and driver[0].isdigit()
        for index in range(count):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            assert gpus._text(nvml.nvmlDeviceGetUUID(handle)).startswith("GPU-")
            assert gpus._text(nvml.nvmlDeviceGetName(handle))
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            assert memory.total > 0
            assert 0 <= memory.used <= memory.total
            # NVML's v1 call counts the driver's reserve as used: used and free
            # add up to the whole card.
            assert abs(memory.total - memory.free - memory.used) <= MIB
            try:
                utilization = nvml.nvmlDeviceGetUtilizationRates(handle)
            except nvml.NVMLError_NotSupported:
                pass
            else:
                assert 0 <= utilization.gpu <= 100
        with pytest.raises(nvml.NVMLError_InvalidArgument):
            nvml.nvmlDeviceGetHandleByIndex(count)
    finally:
        nvml.nvmlShutdown()
    with pytest.raises(nvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()


# What discovery makes of it.

def test_discovery_reports_cards_or_none(impl):
    driver, cards = gpus.probe(impl.nvml)

    if impl.cards == 0:
        assert (driver, cards) == (None, [])
    else:
        assert driver is not None
        assert impl.cards in (None, len(cards))
    assert [card.index for card in cards] == list(range(len(cards)))
    for card in cards:
        assert card.uuid.startswith("GPU-")
        assert card.name
        assert card.memory_total_bytes > 0
        assert 0 <= card.memory_used_bytes <= card.memory_total_bytes
        assert card.utilization_pct is None or 0 <= card.utilization_pct <= 100
    # Every init was matched by a shutdown.
    with pytest.raises(impl.nvml.NVMLError):
        impl.nvml.nvmlDeviceGetCount()


# The fakes say what the recorded machines said.

RECORDED = {
    "h100x8": nvidia_smi_q(HARDWARE / "nvidia-smi-q-8xH100-SXM.txt"),
    "rtx4090": nvidia_smi_q(HARDWARE / "nvidia-smi-q-RTX4090-gpu0-section.txt"),
    "a100-mig": nvidia_smi_q_x(HARDWARE / "nvidia-smi-q-x-A100-SXM4-80GB-MIG.xml"),
}


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_fake_matches_its_recording(name):
    recorded_driver, recorded = RECORDED[name]
    fake = fakenvml.load(str(NVML / f"{name}.json"))

    driver, cards = gpus.probe(fake)

    assert driver == recorded_driver
    assert len(cards) == len(recorded)
    for card, smi in zip(cards, recorded):
        mib = smi["memory_mib"]
        assert card.uuid == smi["uuid"]
        assert card.name == smi["name"]
        assert card.memory_total_bytes == mib["total"] * MIB
        # nvidia-smi prints the reserve apart; discovery counts it as used.
        assert card.memory_used_bytes == (mib["total"] - mib["free"]) * MIB
        assert card.utilization_pct == smi["gpu_util"]


def test_fake_h100_has_eight_cards_as_recorded():
    driver, cards = gpus.probe(fakenvml.load(str(NVML / "h100x8.json")))
    assert driver == "565.57.01"
    assert [c.index for c in cards] == list(range(8))
    assert {c.name for c in cards} == {"NVIDIA H100 80GB HBM3"}
    assert len({c.uuid for c in cards}) == 8
    assert cards[0].memory_total_bytes == 81559 * MIB


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_fake_v2_memory_is_what_nvidia_smi_printed(name):
    # nvidia-smi itself asks the v2 call, which keeps the reserve apart.
    _, recorded = RECORDED[name]
    fake = fakenvml.load(str(NVML / f"{name}.json"))
    fake.nvmlInit()
    try:
        for index, smi in enumerate(recorded):
            memory = fake.nvmlDeviceGetMemoryInfo(
                fake.nvmlDeviceGetHandleByIndex(index), version=fake.nvmlMemory_v2)
            assert memory.total // MIB == smi["memory_mib"]["total"]
            assert memory.reserved // MIB == smi["memory_mib"]["reserved"]
            assert memory.used // MIB == smi["memory_mib"]["used"]
            assert memory.free // MIB == smi["memory_mib"]["free"]
    finally:
        fake.nvmlShutdown()


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_fake_json_names_its_source(name):
    doc = json.loads((NVML / f"{name}.json").read_text())
    source = doc["source"].rsplit("/", 1)[-1]
    assert (HARDWARE / source).exists()
