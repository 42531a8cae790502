"""Whether a llama.cpp build runs on this node: every library found, and ``--version`` answering with its tag.

Asked of a build just unpacked, before it is published, and of every build
installed, again every ``recheck_s``.  A library ldd cannot find is the
advice to install its OS package, or, where the plan allows it and the
package is known, the package installed and ldd asked again.
"""

from __future__ import annotations

import re
from typing import Callable

import attrs
from twisted.logger import Logger

from llmgw.agent.engines import ospackages
from llmgw.engines.base import ProbeFailed, missing_libraries, run_probe
from llmgw.engines.llamacpp import BINARY, _parse_version

from .layout import Unusable

log = Logger()

TAG = re.compile(r"b\d+")


@attrs.frozen
class LlamaCppProof:
    """Runs the checks in threads (*in_thread*, as ``deferToThreadPool``); *manager* is the node's package manager."""

    in_thread: Callable
    manager: str | None
    probe_timeout_s: float
    ldd_timeout_s: float
    os_packages_timeout_s: float

    async def check(self, binary: str, tag: str, *, allowed: Callable[[], bool],
                    repairing: Callable[[str], None]) -> tuple[str, str | None]:
        """The version *binary* reports (the tag when it names no build) and a note; Unusable when it does not run.

        *allowed* says whether the plan lets the node install OS packages;
        *repairing* hears that it does so now, naming them.
        """
        note = await self._libraries(binary, allowed, repairing)
        try:
            output = await self.in_thread(run_probe, [binary, "--version"], self.probe_timeout_s)
        except ProbeFailed as e:
            missing = await self.in_thread(missing_libraries, binary, e.output, self.ldd_timeout_s)
            if missing:
                raise Unusable(ospackages.advice(missing, self.manager)) from None
            raise Unusable(f"{binary} --version failed: {e}") from None
        info, _ = _parse_version(binary, output)
        if info.version is not None and TAG.fullmatch(info.version) and info.version != tag:
            raise Unusable(f"the archive for {tag} holds {BINARY} {info.version}")
        # No build number (a build from outside git): the pinned sha256 is what ties it to the tag.
        return tag, note

    async def _libraries(self, binary: str, allowed: Callable[[], bool],
                         repairing: Callable[[str], None]) -> str | None:
        """Nothing when ldd finds every library; the OS packages run when the plan allows; else Unusable."""
        missing = await self.in_thread(missing_libraries, binary, "", self.ldd_timeout_s)
        if not missing:
            return None
        packages = ospackages.packages_for(missing, self.manager) if self.manager else {}
        known = sorted({p for p in packages.values() if p})
        if not (allowed() and self.manager and known):
            raise Unusable(ospackages.advice(missing, self.manager))
        repairing(f"installing OS packages {', '.join(known)}")
        command = await self.in_thread(ospackages.install, known, self.manager, timeout_s=self.os_packages_timeout_s)
        log.info("installed OS packages for {binary}: {command}", binary=binary, command=command)
        still = await self.in_thread(missing_libraries, binary, "", self.ldd_timeout_s)
        if still:
            raise Unusable(f"{ospackages.advice(still, self.manager)} (after running {command})")
        return f"ran {command}"
