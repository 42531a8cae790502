"""An engine's release archives on their way to the node: fetched, paced, checked, or given up.

``Downloads`` is the Installer's one Fetcher (progress, stall timeout,
resume, size limit: :mod:`llmgw.agent.weights`), held to agent.yaml's
``installs:`` (:mod:`llmgw.agent.weights.pace`): a mirror that sends a byte
every 20 s never trips the stall timeout, and an install waiting on it would
wait for ever, a newer plan queued behind it.  So each download's average
rate over the last ``rate_window_s`` must be at least
``min_rate_bytes_per_s``, and all of it must come within
``download_deadline_s`` of its first request.

Either failing gives the download up: the install is ``broken`` with the
reason, the ``.partial`` stays, and the next attempt (the recheck's) resumes
from it.  ``abort_for`` gives up every download of a build the plan no
longer names, so the newer plan starts at once.  Each archive is checked
against its pinned sha256 before anything else reads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from llmgw.agent.weights import Fetcher, cache_name, partial_name
from llmgw.config.agent import InstallLimits
from llmgw.records import EngineBuild, Progress
from llmgw.sizes import downloaded

from . import assets, layout
from .layout import Unusable

_WHERE = "agent.yaml's installs"


class Downloads:
    """The archives being fetched into *directory*, each for its owner (the build); ``clock=reactor`` unless testing."""

    def __init__(self, reactor, clock, directory: Path, *, limits: InstallLimits,
                 progress: Callable[[Progress], None], status: Callable[[object, str], None], max_bytes: int,
                 connect_timeout_s: float, stall_timeout_s: float, progress_interval_s: float):
        self._progress = progress
        self._status = status  # (owner, what it is doing now)
        self.fetcher = Fetcher(reactor, directory, clock=clock, progress=self._report, environ={},
                               connect_timeout_s=connect_timeout_s, idle_timeout_s=stall_timeout_s,
                               progress_interval_s=progress_interval_s, max_bytes=max_bytes,
                               check="engines.llama.cpp.base_url and version in server.yaml",
                               pace=limits, pace_where=_WHERE)
        self._owners: dict[str, object] = {}  # URL -> the build it is downloaded for

    @property
    def directory(self) -> Path:
        return self.fetcher.weights_dir

    def names(self) -> set[str]:
        """The file names the downloads under way use, which pruning must leave."""
        return {name for url in self._owners for name in (cache_name(url), partial_name(url))}

    async def fetch(self, owner: object, url: str, name: str, sha256: str, in_thread) -> Path:
        """*url* fetched and checked against *sha256*; FetchError or Unusable saying why not."""
        self._status(owner, f"downloading {name}")
        self._owners[url] = owner
        try:
            path = Path(await self.fetcher.fetch(url))
        finally:
            if self._owners.get(url) is owner:
                del self._owners[url]
        self._status(owner, f"checking the sha256 of {name}")
        digest = await in_thread(layout.sha256_of, path)
        if digest != sha256:
            path.unlink(missing_ok=True)
            raise Unusable(f"{name} from {url} has sha256 {digest}, but the sha256 pinned for it is {sha256}; "
                          "the download was deleted: check the mirror, or engines.llama.cpp.sha256 in server.yaml")
        return path

    def abort_for(self, owner: object, reason: str) -> None:
        """Give up every download for *owner* now, each failing with *reason*."""
        for url, its in list(self._owners.items()):
            if its is owner:
                self.abort(url, reason)

    def abort_all(self, reason: str) -> None:
        for url in list(self._owners):
            self.abort(url, reason)

    def abort(self, url: str, reason: str) -> None:
        if self._owners.pop(url, None) is not None:
            self.fetcher.abort(url, reason)  # which logs it

    def _report(self, report: Progress) -> None:
        owner = self._owners.get(report.source)
        if owner is not None and not report.final:
            self._status(owner, f"downloading {report.file_name} {downloaded(report.bytes_done, report.bytes_total)}")
        self._progress(report)


def names_for(wants: EngineBuild, platform: assets.Platform) -> list[str]:
    """The file names a llama.cpp build's archives for *platform* download under, whole or partial."""
    try:
        asset = assets.llama_cpp_asset(wants.version or "", platform, available=wants.sha256)
    except assets.NoAsset:
        return []
    urls = [f"{wants.base_url}{wants.version}/{n}" for n in (asset.name, *asset.extras)]
    return [name for url in urls for name in (cache_name(url), partial_name(url))]

