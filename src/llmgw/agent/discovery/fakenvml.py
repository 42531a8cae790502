"""A stand-in for pynvml that replays a real machine's cards, for hosts without them.

Built from JSON derived from ``nvidia-smi -q`` recordings (tests/fixtures/nvml/),
so a demo or an integration test can run an agent that reports eight H100s on a
laptop: set ``LLMGW_FAKE_NVML=/path/to/h100x8.json`` in the agent's environment.
``LLMGW_FAKE_NVML=no-driver`` is a node whose NVML library is missing.

It implements only the calls discovery makes, and raises pynvml's own exception
classes, so code that catches ``pynvml.NVMLError_NotSupported`` behaves the same
against it.  tests/agent/test_discovery_nvml_contract.py runs one set of checks
against this and against the real pynvml, so the two cannot drift apart.

The JSON file::

    {"driver_version": "565.57.01",
     "gpus": [{"index": 0, "uuid": "GPU-…", "name": "NVIDIA H100 80GB HBM3",
               "memory_mib": {"total": 81559, "reserved": 454, "used": 1, "free": 81106},
               "utilization": {"gpu": 0, "memory": 0}}]}

Memory is in MiB as nvidia-smi prints it.  ``"utilization": null`` answers
NotSupported, as NVML does on a MIG-enabled card.  ``"init_error":
"LibraryNotFound"`` (or "DriverNotLoaded", any NVMLError_ suffix) fails nvmlInit.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from llmgw.agent.discovery.gpus import import_pynvml
from llmgw.errors import ConfigError

ENV = "LLMGW_FAKE_NVML"
NO_DRIVER = "no-driver"
MIB = 1 << 20


class _Handle:
    """Opaque, like NVML's device pointer; only its own FakeNVML accepts it."""

    def __init__(self, owner: FakeNVML, index: int) -> None:
        self.owner = owner
        self.index = index

    def __repr__(self) -> str:
        return f"<fake nvmlDevice {self.index}>"


class FakeNVML:
    """The subset of the pynvml module that discovery uses, answering from recorded data."""

    def __init__(
        self,
        driver_version: str | None = None,
        gpus: Sequence[Mapping[str, Any]] = (),
        init_error: str | None = None,
        bytes_strings: bool = False,
    ) -> None:
        pynvml = import_pynvml()
        self._pynvml = pynvml
        # The module's exception classes, under the module's names, so
        # `except nvml.NVMLError_NotSupported` reads the same for both.
        for name in dir(pynvml):
            if name.startswith("NVMLError"):
                setattr(self, name, getattr(pynvml, name))
        self.nvmlMemory_v2 = pynvml.nvmlMemory_v2
        if init_error is not None and not hasattr(pynvml, f"NVMLError_{init_error}"):
            raise ValueError(f"init_error {init_error!r} is not an NVMLError_ class in pynvml")
        for i, gpu in enumerate(gpus):
            if gpu.get("index", i) != i:
                raise ValueError(f"gpus[{i}] has index {gpu['index']}: NVML indexes are 0..n-1")
        self._driver = driver_version
        self._gpus = list(gpus)
        self._init_error = init_error
        self._bytes = bytes_strings
        self._inits = 0

    # Lifecycle: NVML counts inits, and every call outside one is Uninitialized.

    def nvmlInit(self) -> None:
        if self._init_error is not None:
            raise getattr(self._pynvml, f"NVMLError_{self._init_error}")()
        self._inits += 1

    def nvmlShutdown(self) -> None:
        self._check()
        self._inits -= 1

    def nvmlSystemGetDriverVersion(self) -> str | bytes:
        self._check()
        return self._str(self._driver)

    def nvmlDeviceGetCount(self) -> int:
        self._check()
        return len(self._gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._check()
        if not isinstance(index, int) or not 0 <= index < len(self._gpus):
            raise self._pynvml.NVMLError_InvalidArgument()
        return _Handle(self, index)

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str | bytes:
        return self._str(self._gpu(handle)["uuid"])

    def nvmlDeviceGetName(self, handle: _Handle) -> str | bytes:
        return self._str(self._gpu(handle)["name"])

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: int | None = None) -> Any:
        mib = self._gpu(handle)["memory_mib"]
        total, free = mib["total"] * MIB, mib["free"] * MIB
        if not version:
            # v1 has no reserve of its own: NVML counts it as used, so used is
            # everything that is not free.
            return self._pynvml.c_nvmlMemory_t(total=total, free=free, used=total - free)
        return self._pynvml.c_nvmlMemory_v2_t(
            version=version, total=total, reserved=mib["reserved"] * MIB,
            free=free, used=mib["used"] * MIB,
        )

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> Any:
        utilization = self._gpu(handle)["utilization"]
        if utilization is None:
            raise self._pynvml.NVMLError_NotSupported()
        return self._pynvml.c_nvmlUtilization_t(gpu=utilization["gpu"], memory=utilization["memory"])

    def _check(self) -> None:
        if self._inits <= 0:
            raise self._pynvml.NVMLError_Uninitialized()

    def _gpu(self, handle: _Handle) -> Mapping[str, Any]:
        self._check()
        if not isinstance(handle, _Handle) or handle.owner is not self:
            raise self._pynvml.NVMLError_InvalidArgument()
        return self._gpus[handle.index]

    def _str(self, value: str | None) -> str | bytes:
        if value is None:
            raise self._pynvml.NVMLError_NotSupported()
        # pynvml before 11.5 returned bytes; a fake that can too keeps the decoding honest.
        return value.encode() if self._bytes else value


def load(path: str) -> FakeNVML:
    """A FakeNVML answering from the JSON file at *path*."""
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    return FakeNVML(
        driver_version=doc.get("driver_version"),
        gpus=doc.get("gpus", []),
        init_error=doc.get("init_error"),
        bytes_strings=doc.get("bytes_strings", False),
    )


def from_env(environ: Mapping[str, str] | None = None) -> FakeNVML | None:
    """The fake named by $LLMGW_FAKE_NVML, or None when it is not set."""
    value = (os.environ if environ is None else environ).get(ENV, "")
    if not value:
        return None
    if value == NO_DRIVER:
        return FakeNVML(init_error="LibraryNotFound")
    try:
        return load(value)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(
            f"{ENV}={value}: {e}; point it at a JSON file like tests/fixtures/nvml/h100x8.json,"
            f" or set it to {NO_DRIVER!r}"
        ) from e
