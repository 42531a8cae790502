"""GPU discovery's behaviour at the edges: no driver, partial answers, old pynvml."""

from __future__ import annotations

import json

import pytest
from twisted.logger import capturedLogs

from llmgw.agent.discovery import fakenvml, gpus
from llmgw.errors import ConfigError
from llmgw.records import GPU

from .recordings import NVML


def fake(name):
    return fakenvml.load(str(NVML / f"{name}.json"))


def recorded(name):
    return json.loads((NVML / f"{name}.json").read_text())


@pytest.mark.parametrize("error", ["LibraryNotFound", "DriverNotLoaded", "LibRmVersionMismatch"])
def test_no_usable_driver_is_no_cards(error):
    # A CPU node, a driver unloaded for an upgrade, a library left from the
    # previous driver: none can run CUDA, and none is a failed discovery.
    assert gpus.probe(fakenvml.FakeNVML(init_error=error)) == (None, [])


def test_no_pynvml_is_no_cards(monkeypatch):
    def missing():
        raise ImportError("No module named 'pynvml'")

    monkeypatch.setattr(gpus, "import_pynvml", missing)
    assert gpus.probe() == (None, [])


def test_no_driver_is_said_once_not_every_heartbeat():
    nvml = fakenvml.FakeNVML(init_error="LibraryNotFound")
    with capturedLogs() as events:
        for _ in range(5):
            gpus.probe(nvml)
    said = [e for e in events if "no NVIDIA cards" in e.get("log_format", "")]
    assert len(said) == 1


def test_driver_that_comes_back_and_goes_again_is_said_again():
    absent = fakenvml.FakeNVML(init_error="DriverNotLoaded")
    with capturedLogs() as events:
        gpus.probe(absent)
        gpus.probe(fake("rtx4090"))
        gpus.probe(absent)
    assert sum("no NVIDIA cards" in e.get("log_format", "") for e in events) == 2


def test_mig_card_is_reported_without_utilisation():
    driver, cards = gpus.probe(fake("a100-mig"))
    assert driver == "535.54.03"
    assert cards == [GPU(
        index=0,
        uuid="GPU-513536b6-7d19-9063-b049-1e69664bb298",
        name="NVIDIA A100-SXM4-80GB",
        memory_total_bytes=81920 << 20,
        memory_used_bytes=(81920 - 80999) << 20,
        utilization_pct=None,
    )]


def test_old_pynvml_bytes_are_decoded():
    doc = recorded("rtx4090")
    nvml = fakenvml.FakeNVML(doc["driver_version"], doc["gpus"], bytes_strings=True)
    driver, cards = gpus.probe(nvml)
    assert driver == "550.127.05"
    assert cards[0].name == "NVIDIA GeForce RTX 4090"
    assert cards[0].uuid == "GPU-8ee5f1e0-e705-aac5-6d6e-b97ad59601ef"


class LostCard(fakenvml.FakeNVML):
    """The H100 machine with card 3 fallen off the bus."""

    def nvmlDeviceGetHandleByIndex(self, index):
        if index == 3:
            raise self.NVMLError_GpuIsLost()
        return super().nvmlDeviceGetHandleByIndex(index)


def test_a_card_that_cannot_be_read_is_still_counted():
    doc = recorded("h100x8")
    nvml = LostCard(doc["driver_version"], doc["gpus"])
    _, cards = gpus.probe(nvml)
    assert len(cards) == 8
    assert cards[3] == GPU(index=3)  # every figure unknown, shown as dashes
    assert cards[4].uuid is not None


class Uncountable(fakenvml.FakeNVML):
    def nvmlDeviceGetCount(self):
        raise self.NVMLError_Unknown()


def test_cards_that_cannot_be_counted_are_unknown_not_none():
    driver, cards = gpus.probe(Uncountable(driver_version="565.57.01"))
    assert driver == "565.57.01"
    assert cards is None


def test_each_probe_shuts_nvml_down():
    nvml = fake("h100x8")
    for _ in range(3):
        gpus.probe(nvml)
    assert nvml._inits == 0


def test_fake_named_by_environment(monkeypatch):
    monkeypatch.setenv(fakenvml.ENV, str(NVML / "h100x8.json"))
    driver, cards = gpus.probe()
    assert driver == "565.57.01"
    assert len(cards) == 8


def test_no_driver_named_by_environment(monkeypatch):
    monkeypatch.setenv(fakenvml.ENV, "no-driver")
    assert gpus.probe() == (None, [])


def test_a_wrong_fake_path_is_an_error_that_names_the_variable(monkeypatch, tmp_path):
    missing = tmp_path / "h100.json"
    monkeypatch.setenv(fakenvml.ENV, str(missing))
    with pytest.raises(ConfigError, match=f"LLMGW_FAKE_NVML={missing}"):
        gpus.probe()


def test_fake_raises_pynvml_own_classes():
    # Code written against pynvml catches the fake's errors unchanged.
    pynvml = gpus.import_pynvml()
    nvml = fake("a100-mig")
    nvml.nvmlInit()
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(0)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            nvml.nvmlDeviceGetUtilizationRates(handle)
    finally:
        nvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        fake("no-driver").nvmlInit()


class _CudaDriver(fakenvml.FakeNVML):
    """A recorded card whose driver also says which CUDA it supports (the recordings predate the question)."""

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._check()
        return 12040  # how NVML writes CUDA 12.4


def test_the_cuda_version_the_driver_supports_picks_the_build_a_node_installs():
    doc = recorded("rtx4090")
    assert gpus.cuda_version(_CudaDriver(doc.get("driver_version"), doc.get("gpus", []))) == "12.4"
    assert gpus.cuda_version(fakenvml.FakeNVML(init_error="DriverNotLoaded")) is None
    # An NVML that cannot say: no CUDA build is guessed at.
    assert gpus.cuda_version(fake("rtx4090")) is None
