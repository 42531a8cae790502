"""Which llama.cpp release asset a node needs, from its system, machine and NVIDIA driver.

A llama.cpp release ``b<N>`` publishes assets named
``llama-b<N>-bin-<os>-<variant>-<arch>.<ext>``.  What is known of them, and
what is assumed where nothing was established, from the research notes of
issue 10 (stored release lists and installers of other projects that pin
them; nothing here was fetched from GitHub):

* Extension: ``.zip`` for older builds (seen up to b6987; b7312 still
  published zips while announcing "Linux releases will soon use .tar.gz"),
  ``.tar.gz`` for newer ones (every list seen from b9145 on).  **Assumed:**
  ``.zip`` up to b7312, ``.tar.gz`` after; the first tar.gz build was not
  established (somewhere about b72xx-b78xx).  The switch was for Linux and
  macOS alike (macOS b6862 was a zip).
* Linux x86_64: ``ubuntu-x64``.  Linux s390x: ``ubuntu-s390x`` (seen at b9993
  and in early 2026; **assumed** published at every build).
* Linux aarch64: ``ubuntu-arm64``, except that llama.cpp PR #13996
  (2025-06-03) removed it and it was back by b9174 (still missing on
  2026-02-01, issue #19240).  **Assumed:** absent from b5580 to b9173.
* macOS: ``macos-arm64`` (Apple silicon, Metal) and ``macos-x64``.
* Linux CUDA: none until about b10969-b10996 (PR #28186, 2026-09); then
  ``ubuntu-cuda-<X.Y>-<x64|arm64>.tar.gz`` plus its runtime
  ``cudart-llama-b<N>-bin-ubuntu-cuda-<X.Y>-<arch>.tar.gz``, unpacked into
  the same directory.  Seen: b10996 13.3 x64; b11056 12.8 x64, 13.3 x64 and
  arm64; b11081 13.4 x64 and arm64; b11194 12.8 x64, 13.4 x64 and arm64.
  **Assumed:** from b10996 on, and 12.8 x64 at b11081 too; a build past
  the last one seen publishes what that one did.
* Vulkan, ROCm, SYCL and OpenVINO builds exist for Linux but are never
  chosen here: nothing tells which of them a node's devices run.  A node
  that wants one names it in agent.yaml ``engines.llama.cpp.path``.

Where the assumptions are wrong, ``available`` corrects them: the installer
passes the asset names it holds a sha256 for (server.yaml's
``engines.llama.cpp.sha256`` over the shipped table), and a pinned name
that fits the node wins over the rule, CUDA versions included.  An asset
the rule names but nothing pins is still returned, so the node can say
which digest to add.

A CUDA build is chosen when a driver is loaded, the release has one for the
node's architecture, and its CUDA version is at most what the driver
supports (the highest such); otherwise the CPU build, with a note saying
why the GPUs stay idle for llama.cpp.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection

import attrs

from llmgw.agent.discovery import cpu

_LAST_ZIP = 7312
_NO_LINUX_ARM64 = range(5580, 9174)
# First build of each known set of Linux CUDA builds: arch -> CUDA versions.
_LINUX_CUDA: tuple[tuple[int, dict[str, tuple[str, ...]]], ...] = (
    (10996, {"x64": ("13.3",)}),
    (11056, {"x64": ("12.8", "13.3"), "arm64": ("13.3",)}),
    (11081, {"x64": ("12.8", "13.4"), "arm64": ("13.4",)}),
)

_LINUX_ARCH = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64", "s390x": "s390x"}
_MACOS_ARCH = {"x86_64": "x64", "arm64": "arm64", "aarch64": "arm64"}

# The lowest Linux driver of each CUDA version (NVIDIA's CUDA Toolkit release
# notes, "CUDA Toolkit and Corresponding Driver Versions"), for an inventory
# that carries only the driver; checked against the recorded nvidia-smi runs.
_DRIVER_CUDA = (
    (580, "13.0"), (575, "12.9"), (570, "12.8"), (565, "12.7"), (560, "12.6"), (555, "12.5"),
    (550, "12.4"), (545, "12.3"), (535, "12.2"), (530, "12.1"), (525, "12.0"), (520, "11.8"),
    (515, "11.7"), (510, "11.6"), (495, "11.5"), (470, "11.4"), (465, "11.3"), (460, "11.2"),
    (455, "11.1"), (450, "11.0"),
)


@attrs.frozen
class Platform:
    """What decides which build of an engine this node runs."""

    system: str  # "linux" | "macos" | another os.uname().sysname, lowercased
    machine: str  # as os.uname().machine says: "x86_64", "aarch64", "arm64", "s390x", ...
    # The highest CUDA version the loaded NVIDIA driver supports ("12.4"); None: no driver.
    cuda: str | None = None
    cpu_flags: frozenset[str] = frozenset()


def this_platform(cuda: str | None = None, *, uname=os.uname, proc_root: str = "/proc") -> Platform:
    """This node's Platform; *cuda* is what NVML says the driver supports (see :func:`cuda_of_nvml`)."""
    u = uname()
    system = {"darwin": "macos"}.get(u.sysname.lower(), u.sysname.lower())
    flags: frozenset[str] = frozenset()
    if system == "linux":
        # Only the extensions llama.cpp's builds care about, as discovery reports them.
        flags = frozenset(cpu.probe(proc_root)[0].vector_flags or ())
    return Platform(system=system, machine=u.machine, cuda=cuda, cpu_flags=flags)


def cuda_of_nvml(version: int) -> str:
    """NVML's nvmlSystemGetCudaDriverVersion (12040) as the version llama.cpp's asset names use ("12.4")."""
    return f"{version // 1000}.{version % 1000 // 10}"


def cuda_of_driver(driver: str | None) -> str | None:
    """The CUDA version a Linux NVIDIA driver ("565.57.01") supports at least ("12.7"), for a record with no NVML.

    A driver newer than this table knows gets the table's newest version: a
    lower bound, so a newer CUDA build may be passed over, never one chosen
    that the driver cannot run.  None for no driver, or one older than CUDA 11.
    """
    if not driver:
        return None
    match = re.match(r"(\d+)", driver)
    if match is None:
        return None
    branch = int(match.group(1))
    return next((cuda_version for lowest, cuda_version in _DRIVER_CUDA if branch >= lowest), None)


@attrs.frozen
class Asset:
    """The release asset(s) a node downloads for one llama.cpp build."""

    name: str  # "llama-b6000-bin-ubuntu-x64.zip"
    extras: tuple[str, ...] = ()  # companion archives unpacked into the same dir (a cudart-… runtime)
    note: str | None = None  # why not the build one would hope for


class NoAsset(Exception):
    """A release that has nothing this node can run; str() is the sentence, such as
    "llama.cpp b6000 publishes no build for linux riscv64"."""


def llama_cpp_asset(version: str, platform: Platform, *, available: Collection[str] | None = None) -> Asset:
    """The asset of llama.cpp release *version* ("b6000") for *platform*.

    *available*: the asset names something pins a sha256 for; a pinned name
    that fits is preferred to the module's rules (see the module docstring).
    """
    match = re.fullmatch(r"b(\d+)", version or "")
    if match is None:
        raise NoAsset(
            f"llama.cpp {version!r} is not a release tag: llama.cpp's releases are tagged b<number> "
            "(such as b6000); set engines.llama.cpp.version in server.yaml to one"
        )
    build = int(match.group(1))
    pinned = set(available or ())
    if platform.system == "macos":
        arch = _MACOS_ARCH.get(platform.machine)
        if arch is None:
            raise _none(version, platform)
        return _pick(version, build, [_Choice(f"macos-{arch}")], pinned)
    if platform.system != "linux" or platform.machine not in _LINUX_ARCH:
        raise _none(version, platform)
    arch = _LINUX_ARCH[platform.machine]
    if arch == "arm64" and build in _NO_LINUX_ARM64 and not _pins(pinned, version, f"ubuntu-{arch}"):
        raise NoAsset(
            f"llama.cpp {version} publishes no build for linux aarch64 (the releases from b{_NO_LINUX_ARM64.start} "
            f"to b{_NO_LINUX_ARM64.stop - 1} have none): name a build in agent.yaml engines.llama.cpp.path, "
            f"or choose a release from b{_NO_LINUX_ARM64.stop} on"
        )
    cpu_build = _Choice(f"ubuntu-{arch}")
    if platform.cuda is None or arch == "s390x":
        return _pick(version, build, [cpu_build], pinned)
    published = sorted(set(_known_cuda(build, arch)) | _pinned_cuda(pinned, version, arch), key=_numeric)
    idle = "this node runs the CPU build and its GPUs stay idle for llama.cpp"
    if not published:
        where = "Linux" if arch == "x64" else f"Linux {arch}"
        note = f"llama.cpp {version} publishes no CUDA build for {where}: {idle}; " \
               "name a CUDA build in agent.yaml engines.llama.cpp.path"
        return _pick(version, build, [cpu_build.noted(note)], pinned)
    fitting = [v for v in published if _numeric(v) <= _numeric(platform.cuda)]
    if not fitting:
        note = (
            f"llama.cpp {version}'s Linux CUDA builds need CUDA {published[0]} or newer, and this node's NVIDIA "
            f"driver supports CUDA {platform.cuda}: {idle}; update the driver, or name a CUDA build in agent.yaml "
            "engines.llama.cpp.path"
        )
        return _pick(version, build, [cpu_build.noted(note)], pinned)
    cuda_builds = [
        _Choice(f"ubuntu-cuda-{v}-{arch}", extras=(f"cudart-llama-{version}-bin-ubuntu-cuda-{v}-{arch}.tar.gz",))
        for v in reversed(fitting)
    ]
    best = _name(version, build, cuda_builds[0].variant)[0]
    unpinned = f"server.yaml pins no sha256 for {best}: {idle}; add its digest, and its cudart's, " \
               "under engines.llama.cpp.sha256"
    return _pick(version, build, cuda_builds + [cpu_build.noted(unpinned)], pinned)


@attrs.frozen
class _Choice:
    variant: str  # "ubuntu-x64", "ubuntu-cuda-12.8-x64"
    extras: tuple[str, ...] = ()
    note: str | None = None

    def noted(self, note: str) -> _Choice:
        return attrs.evolve(self, note=note)


def _pick(version: str, build: int, choices: list[_Choice], pinned: set[str]) -> Asset:
    """The first choice something pins (in either extension); with none pinned, the first by the rules."""
    for choice in choices:
        for name in _name(version, build, choice.variant):
            if name in pinned:
                return Asset(name=name, extras=choice.extras, note=choice.note)
    first = choices[0]
    return Asset(name=_name(version, build, first.variant)[0], extras=first.extras, note=first.note)


def _name(version: str, build: int, variant: str) -> tuple[str, str]:
    """The asset name of *variant*, the extension the rule expects first."""
    zip_name, tar_name = f"llama-{version}-bin-{variant}.zip", f"llama-{version}-bin-{variant}.tar.gz"
    return (zip_name, tar_name) if build <= _LAST_ZIP else (tar_name, zip_name)


def _pins(pinned: set[str], version: str, variant: str) -> bool:
    return any(name.startswith(f"llama-{version}-bin-{variant}.") for name in pinned)


def _known_cuda(build: int, arch: str) -> tuple[str, ...]:
    known: tuple[str, ...] = ()
    for first, builds in _LINUX_CUDA:
        if build >= first:
            known = builds.get(arch, ())
    return known


def _pinned_cuda(pinned: set[str], version: str, arch: str) -> set[str]:
    pattern = re.compile(rf"llama-{re.escape(version)}-bin-ubuntu-cuda-(\d+\.\d+)-{arch}\.(?:tar\.gz|zip)")
    return {m.group(1) for m in map(pattern.fullmatch, pinned) if m}


def _numeric(cuda_version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", cuda_version))


def _none(version: str, platform: Platform) -> NoAsset:
    return NoAsset(
        f"llama.cpp {version} publishes no build for {platform.system} {platform.machine}: "
        "name a build made for this node in agent.yaml engines.llama.cpp.path"
    )

