"""NVIDIA cards through NVML.  No driver means no NVIDIA cards, not a failed discovery."""

from __future__ import annotations

import warnings
from typing import Any

from twisted.logger import Logger

from llmgw.records import GPU

log = Logger()

# Why NVML was last found absent, so a CPU node says so once rather than on
# every heartbeat; reset when NVML answers, so a driver that goes away again
# is reported again.
_absent_reason: str | None = None


def import_pynvml() -> Any:
    """pynvml, imported without the deprecation notice of the `pynvml` shim package.

    That package now only forwards to nvidia-ml-py's module of the same name and
    warns on import; the module it forwards to is the one we want.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        import pynvml
    return pynvml


def resolve(nvml: Any = None) -> Any:
    """The NVML to ask: the one passed in, a fake named by $LLMGW_FAKE_NVML, or pynvml.

    None when pynvml is not installed, which is the same as having no driver.
    """
    if nvml is not None:
        return nvml
    from llmgw.agent.discovery import fakenvml

    fake = fakenvml.from_env()
    if fake is not None:
        return fake
    try:
        return import_pynvml()
    except ImportError:
        return None


def probe(nvml: Any = None) -> tuple[str | None, list[GPU] | None]:
    """(driver version, cards).  (None, []) on a node without a usable NVIDIA driver.

    Cards come back as None only when the driver answered and then could not
    say how many cards it has: that is unknown, and must not read as "none".
    """
    nvml = resolve(nvml)
    if nvml is None:
        _absent("pynvml is not installed")
        return None, []
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as e:
        # LibraryNotFound and DriverNotLoaded are every CPU node; anything else
        # at init (a driver/library mismatch after an upgrade) leaves the node
        # just as unable to run CUDA, so it is reported the same way.
        _absent(str(e) or type(e).__name__)
        return None, []
    global _absent_reason
    _absent_reason = None
    try:
        driver = _text(_ask(nvml, nvml.nvmlSystemGetDriverVersion))
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as e:
            log.warn("NVIDIA driver {driver} cannot count its cards: {error}", driver=driver, error=e)
            return driver, None
        return driver, [_card(nvml, index) for index in range(count)]
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass


def _card(nvml: Any, index: int) -> GPU:
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
    except nvml.NVMLError as e:
        # A card that is there but cannot be read (GpuIsLost) still counts: shown
        # with dashes, it tells an operator which one to look at.
        log.warn("GPU {index} cannot be read: {error}", index=index, error=e)
        return GPU(index=index)
    memory = _ask(nvml, nvml.nvmlDeviceGetMemoryInfo, handle)
    # Optional: MIG-enabled cards and some older boards answer NotSupported,
    # and the card is worth reporting without it.
    utilization = _ask(nvml, nvml.nvmlDeviceGetUtilizationRates, handle)
    return GPU(
        index=index,
        uuid=_text(_ask(nvml, nvml.nvmlDeviceGetUUID, handle)),
        name=_text(_ask(nvml, nvml.nvmlDeviceGetName, handle)),
        memory_total_bytes=None if memory is None else int(memory.total),
        # The v1 call counts the driver's reserve as used, so total - used is
        # what a model can actually get.
        memory_used_bytes=None if memory is None else int(memory.used),
        utilization_pct=None if utilization is None else int(utilization.gpu),
    )


def _ask(nvml: Any, call: Any, *args: Any) -> Any:
    try:
        return call(*args)
    except nvml.NVMLError as e:
        log.debug("{call} failed: {error}", call=getattr(call, "__name__", call), error=e)
        return None


def _text(value: Any) -> str | None:
    # pynvml before 11.5 returned bytes; later ones decode for us.
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value


def _absent(reason: str) -> None:
    global _absent_reason
    if reason != _absent_reason:
        log.info("no NVIDIA cards: {reason}", reason=reason)
        _absent_reason = reason


def cuda_version(nvml: Any = None) -> str | None:
    """The highest CUDA version the loaded driver supports ("12.4"); None without a driver.

    Which llama.cpp build a node installs depends on it: a CUDA build whose
    runtime is newer than the driver fails at its first kernel, not at load.
    """
    nvml = resolve(nvml)
    if nvml is None or not hasattr(nvml, "nvmlSystemGetCudaDriverVersion"):
        return None
    try:
        nvml.nvmlInit()
    except nvml.NVMLError:
        return None
    try:
        version = _ask(nvml, nvml.nvmlSystemGetCudaDriverVersion)
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass
    # NVML answers 12040 for 12.4.
    return None if version is None else f"{version // 1000}.{version % 1000 // 10}"
