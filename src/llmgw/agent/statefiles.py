"""The files a shard leaves in the agent's state directory: its record and its log.

``<state_dir>/shards/<name>.json`` holds the engine's pid, the moment it
began, and the full ShardSpec it was started with: a pid identifies a
process, the spec is what lets a restarted agent describe it back to the
control plane. ``<name>.log`` is the engine's stdout and stderr.

A shard id comes from the control plane and contains slashes
("gemma/0/0"); it never becomes a path as it is. The name keeps the id's
safe characters so an operator can find a file by eye, and adds a hash of
the whole id so two ids never share a file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import attrs

from llmgw.durable import write_file
from llmgw.records import ShardSpec
from llmgw.wire import WireError, from_wire, to_wire

FORMAT = 1
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_name(shard_id: str) -> str:
    readable = _UNSAFE.sub("_", shard_id.replace("/", "__")).lstrip(".")[:80] or "shard"
    digest = hashlib.sha256(shard_id.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return f"{readable}-{digest}"


class RecordError(ValueError):
    """A shard record that cannot be read or does not describe a shard.

    ``pid`` and ``create_time`` are set when the file still named a process,
    which is then a process nothing can describe.
    """

    def __init__(self, message: str, pid: int | None = None, create_time: float | None = None):
        super().__init__(message)
        self.pid = pid
        self.create_time = create_time


@attrs.frozen
class Record:
    pid: int
    pgid: int
    create_time: float
    spec: ShardSpec
    endpoint: str
    host: str
    port: int
    # The path a GET answers 200 on once the engine serves; None: a rank that
    # serves no HTTP.
    health: str | None
    started_at: float
    log: str  # file name beside the record
    # A token in the engine's environment (LLMGW_SHARD_RUN), inherited by all
    # it forks: what ties a process to this record beyond its group.
    run: str
    # Where this run's output begins in the log, so a restarted agent reads
    # back this engine's lines and not a previous run's.
    log_offset: int = 0
    draining: bool = False

    def to_json(self) -> dict[str, Any]:
        data = attrs.asdict(self, recurse=False)
        data["spec"] = to_wire(self.spec)
        data["format"] = FORMAT
        return data

    @classmethod
    def from_json(cls, data: Any) -> Record:
        if not isinstance(data, dict):
            raise RecordError("not a JSON object")
        pid, create_time = data.get("pid"), data.get("create_time")
        ident = {}
        if _is_int(pid) and pid > 1 and isinstance(create_time, (int, float)) and not isinstance(create_time, bool):
            ident = {"pid": pid, "create_time": float(create_time)}
        try:
            if data.get("format") != FORMAT:
                raise WireError(f"format {data.get('format')!r}, this agent reads {FORMAT}")
            spec = from_wire(ShardSpec, data.get("spec"), "spec")
            fields = {}
            for name, kind in (("pid", int), ("pgid", int), ("port", int), ("log_offset", int),
                               ("endpoint", str), ("host", str), ("log", str), ("run", str),
                               ("draining", bool)):
                value = data.get(name)
                if kind is int and not _is_int(value) or kind is not int and not isinstance(value, kind):
                    raise WireError(f"{name}: expected {kind.__name__}, got {value!r:.40}")
                fields[name] = value
            for name in ("create_time", "started_at"):
                value = data.get(name)
                if not isinstance(value, (int, float)) or isinstance(value, bool):
                    raise WireError(f"{name}: expected a number, got {value!r:.40}")
                fields[name] = float(value)
            health = data.get("health")
            if health is not None and not (isinstance(health, str) and health.startswith("/")):
                raise WireError(f"health: expected a path or null, got {health!r:.40}")
            if fields["pgid"] != fields["pid"]:
                raise WireError(f"pgid: {fields['pgid']}, but every engine leads its own group ({fields['pid']})")
            if fields["log"] != safe_name(spec.shard_id) + ".log":
                raise WireError(f"log: {fields['log']!r} is not this shard's log")
        except WireError as e:
            raise RecordError(str(e), **ident) from None
        return cls(spec=spec, health=health, **fields)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class StateDir:
    """``<state_dir>/shards``: where records and logs live."""

    def __init__(self, state_dir: Path):
        self.root = Path(state_dir).resolve()
        self.shards = self.root / "shards"
        self.shards.mkdir(parents=True, exist_ok=True)

    def record_path(self, shard_id: str) -> Path:
        return self._inside(safe_name(shard_id) + ".json")

    def log_path(self, shard_id: str) -> Path:
        return self._inside(safe_name(shard_id) + ".log")

    def _inside(self, name: str) -> Path:
        path = self.shards / name
        # safe_name cannot produce a separator; this is the belt to its braces.
        if path.parent != self.shards:
            raise ValueError(f"{name!r} would leave {self.shards}")
        return path

    def records(self) -> list[Path]:
        return sorted(self.shards.glob("*.json"))

    def write(self, record: Record) -> Path:
        """Write *record* so that a reader sees the old file or the new, never half."""
        path = self.record_path(record.spec.shard_id)
        data = json.dumps(record.to_json(), indent=2, sort_keys=True).encode()
        write_file(path, data, private=True, replace=True)
        return path

    def read(self, path: Path) -> Record:
        try:
            text = path.read_text("utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise RecordError(f"cannot read: {e}") from None
        try:
            data = json.loads(text)
        except ValueError as e:
            raise RecordError(f"not JSON: {e}") from None
        record = Record.from_json(data)
        if path.name != safe_name(record.spec.shard_id) + ".json":
            raise RecordError(f"describes shard {record.spec.shard_id!r}, whose record is not this file",
                              record.pid, record.create_time)
        return record

    def remove(self, path: Path) -> None:
        try:
            path.unlink()
        except FileNotFoundError:
            pass

    def set_aside(self, path: Path) -> Path:
        """Keep an unreadable record for a person to look at, out of adoption's way."""
        aside = path.with_name(path.name + ".unreadable")
        os.replace(path, aside)
        return aside

