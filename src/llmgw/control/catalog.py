"""The catalog: what server.yaml asks the fleet to serve, and each entry's fingerprint.

A fingerprint is a short hash of everything that changes how a model's engine
runs — the source and its checksum, the engine and its version, the profile's
arguments, GPUs and ranks.  It travels with every start and comes back in
every status, so a replica started before the catalog was edited shows as
stale, even across a restart of the control plane.  What only decides *where*
a replica may run (memory, node selector) is left out: a replica already
running is not wrong because a new one would be placed elsewhere.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Collection

import attrs

from llmgw.config.catalog import Model, Profile
from llmgw.config.scale import number
from llmgw.config.server import ServerConfig
from llmgw.control.sections import section_changes
from llmgw.errors import ConfigError


@attrs.frozen
class Entry:
    """One model as the reconciler sees it."""

    model: Model
    profile: Profile
    fingerprint: str
    engine_version: str | None = None


def fingerprint(model: Model, profile: Profile, engine_version: str | None) -> str:
    facts = {
        "source": model.source,
        "sha256": model.sha256,
        "engine": profile.engine,
        "engine_version": engine_version,
        "args": list(profile.args),
        "gpus": profile.gpus,
        "ranks": profile.ranks,
    }
    # Only when set, so fingerprints from before these keys stay the same.
    if profile.launcher is not None:
        facts["launcher"] = profile.launcher
    if model.files:
        facts["files"] = list(model.files)
    digest = hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()
    return digest[:12]


def entries(config: ServerConfig) -> dict[str, Entry]:
    out = {}
    for name, model in config.models.items():
        profile = config.profiles[model.profile]
        engine = config.engines.get(profile.engine)
        version = engine.version if engine is not None else None
        out[name] = Entry(model, profile, fingerprint(model, profile, version), version)
    return out


def _build_words(build) -> str:
    """"llama.cpp b6000", "vllm (pip vllm==0.11.0)", "sglang (python /opt/sglang/bin/python)"."""
    how = f"pip {build.pip}" if build.pip else f"python {build.python}" if build.python else None
    words = " ".join(w for w in (build.name, build.version) if w)
    return f"{words} ({how})" if how else words


def _model_change(name: str, old: Entry, new: Entry) -> str:
    """"model qwen changed", or when only its policy (and min) moved, what moved: no replica restarts for that."""
    a, b = old.model.scale, new.model.scale
    if a.max != b.max or attrs.evolve(old, model=attrs.evolve(old.model, scale=b),
                                      profile=attrs.evolve(old.profile, scale=new.profile.scale)) != new:
        return f"model {name} changed"
    moved = ", ".join(f"{f.name} {number(getattr(a, f.name))} to {number(getattr(b, f.name))}"
                      for f in attrs.fields(type(a)) if getattr(a, f.name) != getattr(b, f.name))
    if not moved and b.elastic:
        return f"model {name} unchanged: its own scale keys stand over those of profile {new.profile.name} that changed"
    if not moved:
        return (f"model {name} unchanged: its count is fixed, and the keys of profile {new.profile.name}'s "
                "scale that changed apply only to one that can move")
    return f"model {name}'s scale changed: {moved}"


def check_profiles(config: ServerConfig) -> None:
    """Refuse profiles their engine would refuse — now, not after minutes of loading."""
    from llmgw.engines import validate_profile

    problems = []
    for name, profile in sorted(config.profiles.items()):
        sources = [m.source for m in config.models.values() if m.profile == name]
        if not sources:
            # No model uses it yet: check its arguments, not a source it cannot have.
            sources = ["(no model uses this profile)"]
        for source in sorted(set(sources), key=str):
            for problem in validate_profile(profile.engine, profile.args, gpus=profile.gpus,
                                            ranks=profile.ranks, source=source, launcher=profile.launcher):
                line = f"{config.path}: profiles.{name}: {problem}"
                if line not in problems:
                    problems.append(line)
    if problems:
        raise ConfigError("; ".join(problems))


class Catalog:
    """The server's configuration as it now stands; a failed reload keeps the old one."""

    def __init__(self, config: ServerConfig):
        check_profiles(config)
        self.config = config
        self.entries = entries(config)

    def read(self) -> ServerConfig:
        """The file as it now reads, checked whole; raises ConfigError and changes nothing."""
        from llmgw.config.server import load_server_config

        new = load_server_config(self.config.path)
        check_profiles(new)
        return new

    def changes(self, new: ServerConfig, applied: Collection[str] = ()) -> list[str]:
        """What switching to *new* would change, in the words the log and `ctl reload` use.

        *applied*: the sections the reload's listeners apply (control/sections.py).
        """
        from llmgw.engines.releases import engine_plan

        changes = section_changes(self.config, new, applied)
        before, after = engine_plan(self.config), engine_plan(new)
        if after != before:
            builds = ", ".join(_build_words(b) for b in after.builds) or "no engine builds"
            changes.append(f"engines changed: the nodes now install {builds}")
        old = self.entries
        fresh = entries(new)
        for name in sorted(set(old) | set(fresh)):
            if name not in fresh:
                changes.append(f"model {name} removed")
            elif name not in old:
                changes.append(f"model {name} added")
            elif old[name] != fresh[name]:
                changes.append(_model_change(name, old[name], fresh[name]))
        return changes

    def prepare(self, new: ServerConfig) -> Callable[[], None]:
        """Everything switching to *new* needs, built now; the function returned only swaps it in."""
        fresh = entries(new)

        def apply() -> None:
            self.config = new
            self.entries = fresh

        return apply

    def reload(self) -> list[str]:
        """Read the file again and switch to it; return what changed, or raise ConfigError keeping the old catalog."""
        new = self.read()
        changes = self.changes(new)
        self.prepare(new)()
        return changes
