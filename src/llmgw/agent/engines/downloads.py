"""An engine's release archives on their way to the node: fetched, paced, checked, or given up.

``Downloads`` is the Installer's one Fetcher (progress, stall timeout,
resume, size limit: :mod:`llmgw.agent.weights`) and what the Fetcher alone
does not bound.  A mirror that sends a byte every 20 s never trips the stall
timeout, and an install waiting on it would wait for ever, a newer plan
queued behind it.  So each download is also watched against agent.yaml's
``installs:``:

* its average rate over the last ``rate_window_s`` (once it has run that
  long) must be at least ``min_rate_bytes_per_s``;
* all of it must come within ``download_deadline_s`` of its first request.

Either failing gives the download up (``Fetcher.abort``): the install is
``broken`` with the reason, the ``.partial`` stays, and the next attempt (the
recheck's) resumes from it.  ``abort_for`` gives up every download of a build
the plan no longer names, so the newer plan starts at once.  Each archive is
checked against its pinned sha256 before anything else reads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from twisted.logger import Logger

from llmgw.agent.weights import Fetcher, cache_name, partial_name
from llmgw.config.agent import InstallLimits
from llmgw.records import Progress

from . import layout
from .layout import Unusable

log = Logger()

_WHERE = "agent.yaml's installs"


class Downloads:
    """The archives being fetched into *directory*, each for its owner (the build); ``clock=reactor`` unless testing."""

    def __init__(self, reactor, clock, directory: Path, *, limits: InstallLimits,
                 progress: Callable[[Progress], None], status: Callable[[object, str], None], max_bytes: int,
                 connect_timeout_s: float, stall_timeout_s: float, progress_interval_s: float):
        self._clock = clock
        self._limits = limits
        self._progress = progress
        self._status = status  # (owner, what it is doing now)
        self.fetcher = Fetcher(reactor, directory, clock=clock, progress=self._report, environ={},
                               connect_timeout_s=connect_timeout_s, idle_timeout_s=stall_timeout_s,
                               progress_interval_s=progress_interval_s, max_bytes=max_bytes,
                               check="engines.llama.cpp.base_url and version in server.yaml")
        self._watches: dict[str, _Watch] = {}  # URL -> the download's watch

    @property
    def directory(self) -> Path:
        return self.fetcher.weights_dir

    def names(self) -> set[str]:
        """The file names the downloads under way use, which pruning must leave."""
        return {name for url in self._watches for name in (cache_name(url), partial_name(url))}

    async def fetch(self, owner: object, url: str, name: str, sha256: str, in_thread) -> Path:
        """*url* fetched and checked against *sha256*; FetchError or Unusable saying why not."""
        self._status(owner, f"downloading {name}")
        watch = self._watches[url] = _Watch(self, owner, url, self._clock.seconds())
        try:
            path = Path(await self.fetcher.fetch(url))
        finally:
            watch.stop()
            if self._watches.get(url) is watch:
                del self._watches[url]
        self._status(owner, f"checking the sha256 of {name}")
        digest = await in_thread(layout.sha256_of, path)
        if digest != sha256:
            path.unlink(missing_ok=True)
            raise Unusable(f"{name} from {url} has sha256 {digest}, but the sha256 pinned for it is {sha256}; "
                          "the download was deleted: check the mirror, or engines.llama.cpp.sha256 in server.yaml")
        return path

    def abort_for(self, owner: object, reason: str) -> None:
        """Give up every download for *owner* now, each failing with *reason*."""
        for url, watch in list(self._watches.items()):
            if watch.owner is owner:
                self.abort(url, reason)

    def abort_all(self, reason: str) -> None:
        for url in list(self._watches):
            self.abort(url, reason)

    def abort(self, url: str, reason: str) -> None:
        watch = self._watches.pop(url, None)
        if watch is not None:
            watch.stop()
            log.warn("gave up downloading {url}: {reason}", url=url, reason=reason)
            self.fetcher.abort(url, reason)

    def _report(self, report: Progress) -> None:
        watch = self._watches.get(report.source)
        if watch is not None and not report.final:
            size = _mb(report.bytes_done) + (f"/{_mb(report.bytes_total)}" if report.bytes_total else "")
            self._status(watch.owner, f"downloading {report.file_name} {size} MB")
            watch.saw(report.bytes_done)
        self._progress(report)

    def _too_slow(self, watch: _Watch, reason: str) -> None:
        if self._watches.get(watch.url) is watch:
            self.abort(watch.url, reason)


class _Watch:
    """One download's pace: the bytes it had at each progress report, and its deadline."""

    def __init__(self, downloads: Downloads, owner: object, url: str, started: float):
        self.downloads, self.owner, self.url, self.started = downloads, owner, url, started
        self.limits = downloads._limits
        self.samples: list[tuple[float, int]] = []  # (when, bytes done), from the first report on
        deadline = self.limits.download_deadline_s
        self.timer = None if deadline is None else downloads._clock.callLater(deadline, self._late)

    def stop(self) -> None:
        if self.timer is not None and self.timer.active():
            self.timer.cancel()

    def _late(self) -> None:
        done = self.samples[-1][1] if self.samples else 0
        self.downloads._too_slow(self, (
            f"{self.url}: not all of it came within {self.limits.download_deadline_s:g} s "
            f"({done} bytes came); the download_deadline_s of {_WHERE} gives it that long, "
            "and the next attempt resumes from there"))

    def saw(self, done: int) -> None:
        now = self.downloads._clock.seconds()
        if not self.samples or done < self.samples[-1][1]:
            self.samples = [(now, done)]  # the first report (a resumed download starts above 0), or a restart
            return
        self.samples.append((now, done))
        minimum, window = self.limits.min_rate_bytes_per_s, self.limits.rate_window_s
        if minimum is None or now - self.samples[0][0] < window:
            return
        # The oldest sample still inside the window, and the newest before it: the rate over at least the window.
        while len(self.samples) > 1 and now - self.samples[1][0] >= window:
            del self.samples[0]
        since, then = self.samples[0]
        rate = (done - then) / (now - since)
        if rate < minimum:
            self.downloads._too_slow(self, (
                f"{self.url}: {_rate(rate)} over the last {now - since:g} s, under the minimum of "
                f"{_rate(minimum)} (min_rate_bytes_per_s of {_WHERE}); the next attempt resumes from byte {done}"))


def _rate(bps: float) -> str:
    return f"{bps / 1e3:.1f} kB/s" if bps >= 1e3 else f"{bps:.1f} bytes/s"


def _mb(n: int | None) -> str:
    n = n or 0
    return f"{n / 1e6:.1f}" if n < 10e6 else f"{n / 1e6:.0f}"
