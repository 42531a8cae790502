"""What a wheelhouse lacks for its node: each wheel's ``Requires-Dist`` read with the node's markers, not this machine's.

``pip download --python-version … --platform …`` picks wheels for the
target's tags, but reads its dependencies' environment markers
(``python_version < "3.13"``, ``platform_machine == "aarch64"``) for the
Python that runs pip.  A dependency only the node's Python needs would be
missing, and the node's ``pip install --no-index --require-hashes`` would
stop on it.  :func:`missing` walks the wheelhouse from llmgw's wheel with
the node's marker environment and names each requirement no wheel in it
meets, for :mod:`llmgw.ctl.wheelhouse` to fetch.
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

# A dependency chain longer than this is no wheelhouse of llmgw's.
MAX_ROUNDS = 20


def _packaging():
    try:
        from packaging.markers import Marker  # noqa: F401
        from packaging.requirements import Requirement
        from packaging.version import Version
    except ImportError:  # pip, which a wheelhouse is made with, carries its own
        from pip._vendor.packaging.requirements import Requirement
        from pip._vendor.packaging.version import Version
    return Requirement, Version


def marker_environment(python_version: str, machine: str) -> dict[str, str]:
    """PEP 508's environment of a CPython *python_version* on Linux *machine*, as the node's pip reads markers."""
    return {
        "implementation_name": "cpython", "implementation_version": f"{python_version}.0", "os_name": "posix",
        "platform_machine": machine, "platform_python_implementation": "CPython", "platform_release": "",
        "platform_system": "Linux", "platform_version": "", "python_full_version": f"{python_version}.0",
        "python_version": python_version, "sys_platform": "linux",
    }


def _project(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requires(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        metadata = next((n for n in z.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")), None)
        text = z.read(metadata).decode("utf-8", "replace") if metadata else ""
    head = text.split("\n\n", 1)[0]
    return [line.split(":", 1)[1].strip() for line in head.splitlines() if line.startswith("Requires-Dist:")]


def missing(wheels: dict[str, tuple[str, Path]], top: str, environment: dict[str, str]) -> list[str]:
    """Each requirement (``NAME[EXTRAS]SPECIFIER``) reached from *top* that no wheel of *wheels* meets.

    *wheels* maps a project's normalized name to its version and file.
    """
    Requirement, Version = _packaging()
    wanted, seen, lacking = [(top, frozenset())], set(), {}
    while wanted:
        name, extras = wanted.pop()
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        for text in _requires(wheels[name][1]):
            requirement = Requirement(text)
            marker = requirement.marker
            if marker is not None and not any(marker.evaluate({**environment, "extra": e})
                                               for e in (sorted(extras) or [""])):
                continue
            needed = _project(requirement.name)
            held = wheels.get(needed)
            if held is None or not requirement.specifier.contains(Version(held[0]), prereleases=True):
                requirement.marker = None
                lacking[str(requirement)] = None
                continue
            wanted.append((needed, frozenset(requirement.extras)))
    return sorted(lacking)
