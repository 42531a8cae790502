"""A stand-in for the Installer, for tests of what the agent makes of its entries.

It has the Installer's constructor and the methods the agent calls; what it
reports is what the test puts in ``entries`` and ``binaries``, and every
converge is kept with the in_use callable it was given.  The real Installer
is exercised against a local release mirror in tests/integration/test_engine_install.py.
"""

from __future__ import annotations

from twisted.internet import defer

from llmgw.records import EngineInfo


class StandInInstaller:
    def __init__(self, reactor, root, *, platform, progress, changed, **_):
        self.root = root
        self.platform = platform
        self.progress = progress
        self.changed = changed
        self.reported: list[EngineInfo] = []
        self.binaries: dict[tuple[str, str | None], str] = {}
        self.converged: list[tuple[object, object]] = []
        self.started = False

    def converge(self, plan, in_use):
        self.converged.append((plan, in_use))
        return defer.succeed(None)

    def entries(self) -> list[EngineInfo]:
        return list(self.reported)

    def binary(self, name, version):
        return self.binaries.get((name, version))

    def show(self, *entries: EngineInfo, binaries=None) -> None:
        """What the real one does when an install moves on: new entries, then changed()."""
        self.reported = list(entries)
        self.binaries = dict(binaries or {})
        self.changed()

    def start(self):
        self.started = True

    def stop(self):
        self.started = False
