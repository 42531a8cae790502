"""The node's engines: installed by the node itself, proven to run, checked again, removed when no longer named.

``Installer.converge(plan, in_use)`` makes the builds of an ``EnginePlan``
usable here.  A llama.cpp build is a release asset fetched from the plan's
``base_url`` through the weights' own Fetcher (the same progress, stall
timeout and resume; a minimum rate and a deadline besides, and given up when
a newer plan no longer names it: :mod:`.downloads`), checked against the
plan's sha256 before anything is
unpacked, unpacked beside its final place, and proven: ``ldd`` finds every
library of llama-server, and ``--version`` answers with the build the tag
names.  Only then is the folder renamed to ``<root>/llama.cpp/<tag>`` and its
marker (``.llmgw-installed``, JSON) written, atomically and last; a folder
without a marker is never reported, and is removed when the agent starts.
A Python engine is a ``python:`` probed as given, or a ``pip:`` spec
installed into ``<root>/<name>/<key>/``, a venv of its own (see
:mod:`.pip`).  What an install is on disk, and what is left of one that
did not finish, is :mod:`.layout`'s.

Every build installed is checked again every ``recheck_s`` (an unrelated
upgrade can remove a library): broken then, it is reported broken with the
reason, and installed again once the check passes.  A version on disk that
the plan no longer names is removed, unless ``in_use()`` says a shard runs
it; that is asked again at each converge and recheck.  What the node reports
is ``entries()``: one ``EngineInfo`` per build, origin ``server.yaml``.  A
build's state moves only by :mod:`.buildlife`'s table.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import sys
from pathlib import Path
from typing import Callable

import attrs
from twisted.internet import defer, task, threads
from twisted.logger import Logger

from llmgw.agent.engines import archive, assets, ospackages
from llmgw.agent.weights import FetchError, cache_name
from llmgw.config.agent import InstallLimits
from llmgw.engines.llamacpp import BINARY
from llmgw.records import EngineBuild, EngineInfo, EnginePlan, Progress
from llmgw.states import EngineState

from . import downloads, layout, pip
from .buildlife import BuildInput, BuildLifecycle
from .downloads import Downloads
from .layout import DOWNLOADS, MARKER, Unusable
from .proving import TAG, LlamaCppProof

__all__ = ["DOWNLOADS", "MARKER", "Installer", "Unusable"]

log = Logger()

LLAMA_CPP = "llama.cpp"
ORIGIN = "server.yaml"
_DETECT = ...

_REFUSALS = (Unusable, FetchError, archive.UnsafeArchive, assets.NoAsset, ospackages.OSPackagesFailed)


@attrs.define(eq=False)
class _Build:
    """One engine build as this node knows it: the plan's (maybe still installing) or one on disk."""

    name: str
    version: str | None
    life: BuildLifecycle
    reason: str | None = None
    path: str | None = None  # what runs it: llama-server, or the Python
    directory: Path | None = None  # None: a python: build, used where it is
    wants: EngineBuild | None = None  # the plan's build this one is, if any
    note: str | None = None  # the reason an installed build carries (a CPU build on a GPU node)

    @property
    def state(self) -> EngineState:
        return self.life.state

    def info(self) -> EngineInfo:
        return EngineInfo(self.name, self.version, self.path, self.state, self.reason, ORIGIN)


class Installer:
    """Converges this node on an ``EnginePlan`` under *root*; pass ``clock=reactor`` unless you are testing.

    *progress* receives the ``Progress`` of every download and pip install,
    *changed* is called whenever ``entries()`` would answer differently.
    *os_packages_manager* is the package manager to name in advice and to
    run when the plan allows it; left out, the node's own is looked up.
    """

    def __init__(self, reactor, root: Path, *, platform: assets.Platform, progress: Callable[[Progress], None],
                 changed: Callable[[], None], recheck_s: float = 600.0, os_packages_manager: str | None = _DETECT,
                 clock=None, python: str = sys.executable, max_download_bytes: int = 4 * 2**30,
                 connect_timeout_s: float = 30.0, stall_timeout_s: float = 60.0, progress_interval_s: float = 1.0,
                 probe_timeout_s: float = 30.0, ldd_timeout_s: float = 10.0, os_packages_timeout_s: float = 900.0,
                 venv_timeout_s: float = 300.0, pip_timeout_s: float = 3600.0,
                 limits: InstallLimits = InstallLimits()):
        self._reactor = reactor
        self._clock = clock if clock is not None else reactor
        self.root = Path(root)
        self._platform = platform
        self._progress = progress
        self._changed = changed
        self._recheck_s = recheck_s
        self._manager = ospackages.package_manager() if os_packages_manager is _DETECT else os_packages_manager
        self._python = python
        self._interval_s = progress_interval_s
        self._probe_timeout_s, self._venv_timeout_s, self._pip_timeout_s = probe_timeout_s, venv_timeout_s, pip_timeout_s
        self._proof = LlamaCppProof(self._in_thread, self._manager, probe_timeout_s, ldd_timeout_s, os_packages_timeout_s)
        self._downloads = Downloads(reactor, self._clock, self.root / DOWNLOADS, limits=limits, progress=progress,
                                    status=lambda b, text: self._set(b, BuildInput.STEP, text),
                                    max_bytes=max_download_bytes, connect_timeout_s=connect_timeout_s,
                                    stall_timeout_s=stall_timeout_s, progress_interval_s=progress_interval_s)
        self._plan: EnginePlan | None = None  # None until the control plane has said
        self._in_use: Callable[[], set[tuple[str, str]]] = set
        self._current: dict[str, _Build] = {}  # engine name -> the plan's build of it
        self._disk: dict[Path, _Build] = {}  # install folder -> a marked install
        self._pending: set[str] = set()  # engine names whose plan build wants an attempt
        self._workers: dict[str, defer.Deferred] = {}
        self._attempting: dict[str, _Build] = {}  # engine name -> the build its worker is installing now
        self._stoppable: dict[_Build, defer.Deferred] = {}  # a build -> its pip install running now
        self._idle: dict[str, list[defer.Deferred]] = {}
        self._rechecks: task.LoopingCall | None = None
        self._rechecking: defer.Deferred | None = None
        self._reported: list[EngineInfo] = []

    # -- what the agent asks -------------------------------------------------

    def entries(self) -> list[EngineInfo]:
        """Every build of the current plan, then every other version still on disk."""
        out: list[EngineInfo] = []
        seen: set[tuple[str, str | None]] = set()
        builds = [self._current[b.name] for b in self._plan_builds() if b.name in self._current]
        for build in [*builds, *(b for b in self._disk.values() if b not in builds)]:
            if (build.name, build.version) not in seen:
                seen.add((build.name, build.version))
                out.append(build.info())
        return out

    def binary(self, name: str, version: str | None) -> str | None:
        """What runs *name* at *version* (None: the newest installed), or None when no such build is installed."""
        usable = [b for b in self._usable() if b.name == name and (version is None or b.version == version)]
        if not usable:
            return None
        return max(usable, key=lambda b: _version_key(b.version)).path

    def start(self) -> None:
        """Read what earlier runs installed, remove what they left half-done, and start the rechecks."""
        self._read_disk()
        self._touch()
        self._rechecks = task.LoopingCall(self.recheck)
        self._rechecks.clock = self._clock
        self._rechecks.start(self._recheck_s, now=False)

    def stop(self) -> None:
        if self._rechecks is not None and self._rechecks.running:
            self._rechecks.stop()
        self._downloads.abort_all("the agent is stopping")
        for worker in list(self._workers.values()):
            worker.addErrback(lambda f: None if f.check(defer.CancelledError) else f)
            worker.cancel()

    def converge(self, plan: EnginePlan, in_use: Callable[[], set[tuple[str, str]]]) -> defer.Deferred:
        """Install what *plan* names and is not installed, remove what it no longer names; fires when all have settled."""
        self._plan, self._in_use = plan, in_use
        named = {b.name for b in plan.builds}
        for name in [n for n in self._current if n not in named]:
            del self._current[name]
        for build in plan.builds:
            current = self._current.get(build.name)
            if current is None or current.wants != build or current.state is not EngineState.INSTALLED:
                self._want(build)
        for name, attempt in list(self._attempting.items()):
            if (wanted := self._current.get(name)) is not attempt:  # superseded: the newer plan need not wait
                now = f"it names {name} {wanted.version}" if wanted else f"it no longer names {name}"
                self._downloads.abort_for(attempt, f"the plan changed ({now}) while {attempt.version} downloaded")
                if (installing := self._stoppable.pop(attempt, None)) is not None:
                    installing.cancel()  # pip, and whatever it started
        self._remove_unwanted()
        self._touch()
        if any(b.state is EngineState.BROKEN for b in self._checkable()):
            self.recheck()  # the plan may allow OS packages now, or the library is back
        return defer.gatherResults([self._settled(name) for name in named]).addCallback(lambda _: None)

    # -- installing ----------------------------------------------------------

    def _want(self, build: EngineBuild) -> None:
        installed = self._disk.get(self._directory(build)) if self._directory(build) else None
        if installed is not None:
            # Installed once: rechecks say whether it runs; reinstalling could pull it from under a shard.
            installed.wants = build
            self._current[build.name] = installed
            return
        current = self._current.get(build.name)
        if current is not None and current.wants == build and build.name in self._workers:
            return  # being attempted now; asking again must not queue a second attempt
        if current is None or current.wants != build:
            self._current[build.name] = _Build(build.name, build.version, BuildLifecycle(), "waiting to install",
                                               wants=build)
        self._pending.add(build.name)
        if build.name not in self._workers:
            worker = defer.Deferred.fromCoroutine(self._work(build.name))
            if not worker.called:
                self._workers[build.name] = worker

    def _settled(self, name: str) -> defer.Deferred:
        d: defer.Deferred = defer.Deferred()
        if name in self._workers:
            self._idle.setdefault(name, []).append(d)
        else:
            d.callback(None)
        return d

    async def _work(self, name: str) -> None:
        """Attempt the plan's build of *name* until no newer one is wanted: one install of an engine at a time."""
        try:
            while name in self._pending and name in self._current:
                self._pending.discard(name)
                build = self._current[name]
                if build.directory is None or self._disk.get(build.directory) is not build:
                    self._attempting[name] = build
                    try:
                        await self._attempt(build)
                    finally:
                        self._attempting.pop(name, None)
        finally:
            self._workers.pop(name, None)
            for d in self._idle.pop(name, []):
                d.callback(None)

    async def _attempt(self, build: _Build) -> None:
        wants = build.wants
        assert wants is not None
        self._set(build, BuildInput.ATTEMPT, "waiting to install")
        try:
            if wants.name == LLAMA_CPP:
                done = await self._install_llama_cpp(build, wants)
            elif wants.name in pip.MODULES and wants.python:
                build.path = wants.python
                done = await self._probe_python(build, wants)
            elif wants.name in pip.MODULES and wants.pip:
                done = await self._install_pip(build, wants)
            elif wants.name in pip.MODULES:
                raise Unusable(f"engines.{wants.name} in server.yaml names neither python: nor pip:")
            else:
                raise Unusable(f"this llmgw cannot install {wants.name}; it installs llama.cpp, vllm and sglang")
        except _REFUSALS as e:
            log.warn("{name} {version} not installed: {reason}", name=wants.name, version=wants.version, reason=e)
            return self._set(build, BuildInput.REFUSED, str(e))
        except OSError as e:
            where = f"{e.filename}: " if e.filename else ""
            reason = f"{where}{e.strerror or e}; check the space and permissions of {self.root}"
            log.warn("{name} {version} not installed: {reason}", name=wants.name, version=wants.version, reason=reason)
            return self._set(build, BuildInput.REFUSED, reason)
        except defer.CancelledError:
            raise
        except Exception as e:
            log.failure("installing {name} {version}", name=wants.name, version=wants.version)
            return self._set(build, BuildInput.REFUSED, f"installing failed unexpectedly ({e!r}); see the agent's log")
        # Proven: a record of its own, begun installed, takes the attempt's place.
        if self._current.get(wants.name) is build:
            self._current[wants.name] = done
        else:
            self._remove_unwanted()  # the plan moved on while this installed
        self._touch()

    async def _install_llama_cpp(self, build: _Build, wants: EngineBuild) -> _Build:
        tag = wants.version
        if not tag or not wants.base_url:
            raise Unusable("engines.llama.cpp in server.yaml needs a version and a base_url")
        asset = assets.llama_cpp_asset(tag, self._platform, available=wants.sha256)
        if asset.note:
            log.warn("llama.cpp {tag}: {note}", tag=tag, note=asset.note)
        names = [asset.name, *asset.extras]
        for name in names:
            if name not in wants.sha256:
                raise Unusable(f"no sha256 for {name} in engines.llama.cpp.sha256 of server.yaml: "
                              "add it from the release page")
        final = self._directory(wants)
        temp = final.parent / f"{layout.TEMP}{tag}-{secrets.token_hex(4)}"
        final.parent.mkdir(parents=True, exist_ok=True)
        try:
            # Every archive is checked before any is unpacked.
            downloaded = [await self._downloads.fetch(build, f"{wants.base_url}{tag}/{name}", name,
                                                      wants.sha256[name].lower(), self._in_thread) for name in names]
            self._set(build, BuildInput.STEP, f"unpacking {asset.name}")
            await self._in_thread(archive.extract, downloaded[0], temp)
            binary = layout.find_binary(temp, asset.name)
            for name, path in zip(names[1:], downloaded[1:]):
                self._set(build, BuildInput.STEP, f"unpacking {name}")
                await self._in_thread(layout.merge_extra, path, binary.parent)
            self._set(build, BuildInput.STEP, f"checking {BINARY} (ldd, --version)")
            version, ran = await self._check_llama_cpp(build, str(binary), tag)
            # What an operator should know of a build that runs: the CPU build on a GPU node, the packages installed.
            note = "; ".join(n for n in (asset.note, ran) if n) or None
            relative = binary.relative_to(temp)
            marker = {"version": version, "path": str(final / relative), "sha256": wants.sha256[asset.name],
                      "assets": {n: wants.sha256[n] for n in names}, "note": note,
                      "installed_at": self._clock.seconds()}
            await self._in_thread(layout.publish, temp, final, marker)
        finally:
            await self._in_thread(shutil.rmtree, temp, True)
        for name in names:
            await self._in_thread(layout.remove_download, self._downloads.directory,
                                  cache_name(f"{wants.base_url}{tag}/{name}"))
        log.info("llama.cpp {version} installed in {final}", version=version, final=final)
        return self._record(_Build(LLAMA_CPP, version, _installed(), note, str(final / relative), final, wants, note))

    async def _check_llama_cpp(self, build: _Build, binary: str, tag: str) -> tuple[str, str | None]:
        """The version *binary* reports and a note (:mod:`.proving`); Unusable when it does not run."""
        allowed = lambda: self._plan is not None and self._plan.install_os_packages  # noqa: E731
        return await self._proof.check(binary, tag, allowed=allowed,
                                       repairing=lambda text: self._set(build, BuildInput.REPAIR, text))

    async def _probe_python(self, build: _Build, wants: EngineBuild) -> _Build:
        python = wants.python or ""
        self._set(build, BuildInput.STEP, f"probing {python}")
        version = await self._in_thread(pip.probe, python, wants.name, self._probe_timeout_s)
        pip.check_version(wants, python, version)
        return _Build(wants.name, version, _installed(), None, python, None, wants)

    async def _install_pip(self, build: _Build, wants: EngineBuild) -> _Build:
        directory = self._directory(wants)
        await self._in_thread(shutil.rmtree, directory, True)  # a leftover without its marker
        self._set(build, BuildInput.STEP, f"pip install {wants.pip}")
        try:
            installing = self._stoppable[build] = defer.Deferred.fromCoroutine(pip.install_venv(
                self._reactor, self._clock, directory, wants, python=self._python, progress=self._progress,
                venv_timeout_s=self._venv_timeout_s, pip_timeout_s=self._pip_timeout_s,
                progress_interval_s=self._interval_s))
            try:
                python = await installing
            except defer.CancelledError:
                if build in self._stoppable:
                    raise  # the agent is stopping
                raise Unusable(f"the plan changed while pip installed {wants.pip}; it was stopped") from None
            finally:
                self._stoppable.pop(build, None)
            self._set(build, BuildInput.STEP, f"probing {python}")
            version = await self._in_thread(pip.probe, python, wants.name, self._probe_timeout_s)
            pip.check_version(wants, python, version)
            marker = {"version": version, "path": python, "sha256": None, "pip": wants.pip,
                      "index_url": wants.index_url, "installed_at": self._clock.seconds()}
            await self._in_thread(layout.write_marker, directory, marker)
        except BaseException:
            await self._in_thread(shutil.rmtree, directory, True)
            raise
        log.info("{name} {version} installed in {directory}", name=wants.name, version=version, directory=directory)
        return self._record(_Build(wants.name, version, _installed(), None, python, directory, wants))

    # -- checking again, removing --------------------------------------------

    def recheck(self) -> defer.Deferred:
        """Check every build again now (what the rechecks do every recheck_s); fires when done."""
        running = self._rechecking
        if running is None:
            running = self._rechecking = defer.Deferred.fromCoroutine(self._recheck())
            running.addErrback(lambda f: log.failure("checking the installed engines again", f))
            running.addBoth(self._rechecked)
        d: defer.Deferred = defer.Deferred()
        running.addBoth(self._chain, d)
        return d

    def _rechecked(self, _) -> None:
        self._rechecking = None

    @staticmethod
    def _chain(result, d: defer.Deferred):
        d.callback(None)
        return result

    async def _recheck(self) -> None:
        for build in self._checkable():
            if build.name in self._workers:
                continue  # an install of this engine is running; it checks its own
            try:
                reason = await self._check(build)
            except _REFUSALS as e:
                if build.state is not EngineState.BROKEN:
                    log.warn("{name} {version} does not run any more: {reason}", name=build.name,
                             version=build.version, reason=e)
                self._set(build, BuildInput.FAILS, str(e))
                continue
            if build.state is EngineState.BROKEN:
                log.info("{name} {version} runs again", name=build.name, version=build.version)
            self._set(build, BuildInput.RUNS, reason or build.note)
        self._remove_unwanted()
        for wants in self._plan_builds():
            current = self._current.get(wants.name)
            if current is not None and current.state is EngineState.BROKEN and current not in self._checkable():
                self._want(wants)  # never installed: try again, the mirror or the node may be mended

    async def _check(self, build: _Build) -> str | None:
        """Whether *build*, installed once (or a python: as given), still runs; Unusable saying why not."""
        if build.name == LLAMA_CPP:
            return (await self._check_llama_cpp(build, build.path or "", build.version or ""))[1]
        version = await self._in_thread(pip.probe, build.path or "", build.name, self._probe_timeout_s)
        if build.directory is None and build.wants is not None:
            pip.check_version(build.wants, build.path or "", version)
            build.version = version
        elif version != build.version:
            raise Unusable(f"{build.path} has {build.name} {version} now, installed as {build.version}")
        return None

    def _checkable(self) -> list[_Build]:
        """Builds installed once, and the python: builds, which are probed where they are."""
        found = list(self._disk.values())
        return found + [b for b in self._current.values() if b.directory is None and b.path and b not in found]

    def _usable(self) -> list[_Build]:
        return [b for b in self._checkable() if b.state is EngineState.INSTALLED]

    def _plan_builds(self) -> list[EngineBuild]:
        return self._plan.builds if self._plan is not None else []

    def _remove_unwanted(self) -> None:
        if self._plan is None:
            return  # not told yet what is wanted: a restarted agent keeps everything until it is
        wanted = {self._directory(b) for b in self._plan.builds} - {None}
        busy = self._in_use()
        for directory, build in list(self._disk.items()):
            if directory in wanted or (build.name, build.version) in busy or (build.name, None) in busy:
                continue
            del self._disk[directory]
            log.info("removing {name} {version} from {directory}: the plan no longer names it",
                     name=build.name, version=build.version, directory=directory)
            # Out of the way at once, so an install of the same version can come back at that name
            # while the old files are deleted; a crash before the end leaves a .tmp- for start().
            going = directory.with_name(f"{layout.TEMP}removing-{directory.name}-{secrets.token_hex(4)}")
            try:
                os.rename(directory, going)
            except OSError as e:
                log.warn("cannot remove {directory}: {error}", directory=directory, error=e.strerror)
                continue
            self._in_thread(shutil.rmtree, going, True)
        keep = {name for b in self._plan.builds if b.name == LLAMA_CPP and b.version and b.base_url
                for name in downloads.names_for(b, self._platform)}
        keep |= self._downloads.names()
        self._in_thread(layout.prune_downloads, self._downloads.directory, keep).addErrback(
            lambda f: log.failure("pruning {directory}", f, directory=self._downloads.directory))

    # -- state -----------------------------------------------------------------

    def _directory(self, build: EngineBuild) -> Path | None:
        if build.name == LLAMA_CPP:
            return self.root / LLAMA_CPP / build.version if TAG.fullmatch(build.version or "") else None
        if build.name in pip.MODULES and build.pip and not build.python:
            return self.root / build.name / pip.venv_key(build)
        return None

    def _record(self, build: _Build) -> _Build:
        assert build.directory is not None
        self._disk[build.directory] = build
        return build

    def _set(self, build: _Build, event: BuildInput, reason: str | None) -> None:
        """Move *build* on by *event*, saying *reason*; nothing changes when its state ignores *event*."""
        if build.life.fire(event) is not None:
            build.reason = reason
            self._touch()

    def _touch(self) -> None:
        now = self.entries()
        if now != self._reported:
            self._reported = now
            try:
                self._changed()
            except Exception:
                log.failure("the engines' changed() callback failed")

    def _in_thread(self, fn, *args, **kw) -> defer.Deferred:
        return threads.deferToThreadPool(self._reactor, self._reactor.getThreadPool(), fn, *args, **kw)

    def _read_disk(self) -> None:
        for name, folder, marker in layout.read_installs(self.root, (LLAMA_CPP, *pip.MODULES)):
            note = marker.get("note") if isinstance(marker.get("note"), str) else None
            self._disk[folder] = _Build(name, marker.get("version"), _installed(), note, marker.get("path"), folder,
                                        note=note)


def _installed() -> BuildLifecycle:
    """The life of a build proven by its install, or found on disk with its marker."""
    return BuildLifecycle(EngineState.INSTALLED)


def _version_key(version: str | None) -> tuple:
    return tuple(int(p) if p.isdigit() else -1 for p in re.findall(r"\d+|[A-Za-z]+", version or ""))

