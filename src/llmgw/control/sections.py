"""Where each key of server.yaml takes effect: read once when the server starts, or applied by a reload.

A reload's summary (the log line, ``llmgw ctl reload``) names every key that
changed, and says of each one whether the running server now uses it or it
waits for a restart.  A section a reload applies and the summary leaves out
reads as "no changes" to the operator who just added it (``pki:`` did).
``models:`` and ``engines:`` are the catalog's to describe (model by model,
build by build); everything else is described here, key by key.
"""

from __future__ import annotations

from collections.abc import Collection

import attrs

from llmgw.config.server import ServerConfig

# The catalog's own sections: the catalog says what changed in them, model by model.
CATALOG = ("models", "engines")

# Keys the running server reads only while it starts: a section named alone is read whole.
AT_START = (
    "listen",
    "tls.ca", "tls.cert", "tls.key",
    "link",
    "fleet.unreachable_after_s", "fleet.lost_after_s", "fleet.settle_s", "fleet.settle_quiet_s",
    "fleet.settle_max_s",
    "admin.on_api",
    "history",
    "ha",
)

# Keys the control plane itself applies on every reload (beside its listeners').
APPLIED_BY_CONTROL = ("profiles", "pki", "fleet", "models", "engines")

# What a section applied by a listener waits for when this server runs none that applies it.
NEEDS = {"router": "listen.api"}

def changed_keys(old: ServerConfig, new: ServerConfig) -> list[str]:
    """Every key of server.yaml whose value differs, as ``section.key`` (a mapping's entries as ``section.name``)."""
    keys = []
    for field in attrs.fields(ServerConfig):
        if field.name == "path" or field.name in CATALOG:
            continue
        before, after = getattr(old, field.name), getattr(new, field.name)
        if before == after:
            continue
        if attrs.has(type(before)) and type(before) is type(after):
            keys += [f"{field.name}.{f.name}" for f in attrs.fields(type(before))
                     if getattr(before, f.name) != getattr(after, f.name)]
        elif isinstance(before, dict) and isinstance(after, dict):
            # A profile a model names is told in that model's line ("model echo changed").
            told = {m.profile for m in (*old.models.values(), *new.models.values())} if field.name == "profiles" else ()
            keys += [f"{field.name}.{name}" for name in sorted(set(before) | set(after))
                     if before.get(name) != after.get(name) and name not in told]
        else:
            keys.append(field.name)
    return keys


def _covers(rules: Collection[str], key: str) -> bool:
    return any(key == rule or key.startswith(rule + ".") for rule in rules)


def section_changes(old: ServerConfig, new: ServerConfig, applied: Collection[str] = ()) -> list[str]:
    """The reload summary's lines for every section but the catalog's, one per kind of change.

    *applied* names the sections (or ``section.key``) the server's reload
    listeners apply; the control plane's own are always applied.  A key read
    only at start says so; a key nothing running applies says what it waits for.
    """
    at_start, live, unused = [], [], []
    for key in changed_keys(old, new):
        if _covers(AT_START, key):
            at_start.append(key)
        elif _covers(APPLIED_BY_CONTROL, key) or _covers(applied, key):
            live.append(key)
        else:
            unused.append(key)
    lines = []
    if live:
        lines.append(f"{', '.join(live)} changed")
    if at_start:
        they = "they take" if len(at_start) > 1 else "it takes"
        lines.append(f"{', '.join(at_start)} changed: {they} effect when the server restarts")
    for key in unused:
        section = key.split(".", 1)[0]
        waits = f"a restart with {NEEDS[section]} set" if section in NEEDS else "a restart"
        lines.append(f"{key} changed: nothing in this server uses it yet; it waits for {waits}")
    return lines
