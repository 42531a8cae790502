"""The state directory's files: names a shard id cannot steer, records, log tails."""

from __future__ import annotations

import errno
import json
import os
import stat

import pytest
import pytest_twisted
from hypothesis import given
from hypothesis import strategies as st

from llmgw.agent.logtail import MAX_READ_BYTES, LogFollower
from llmgw.agent.statefiles import Record, RecordError, StateDir, safe_name

from .supervisorharness import harness, make_spec  # noqa: F401 - the fixture, by name


@given(st.text(min_size=1, max_size=300))
def test_a_shard_id_becomes_a_plain_file_name(shard_id):
    name = safe_name(shard_id)
    assert "/" not in name and "\0" not in name and not name.startswith(".")
    assert 0 < len(name) <= 91


def test_ids_that_read_alike_get_different_files():
    ids = ["m/0/0", "m__0__0", "m/0__0", "m_0_0", "m/0/0 ", "../m/0/0"]
    assert len({safe_name(i) for i in ids}) == len(ids)
    assert safe_name("gemma-3/0/1").startswith("gemma-3__0__1-")


@pytest_twisted.ensureDeferred
async def test_a_shard_id_that_climbs_out_writes_inside_the_state_directory(harness, tmp_path):
    sup = harness.supervisor()
    sneaky = "../../../escaped/0/0"
    sup.start(make_spec(sneaky))
    await harness.reports.reach("ready")
    shards = harness.state_dir / "shards"
    written = sorted(p.name for p in shards.iterdir())
    assert written == [safe_name(sneaky) + ".json", safe_name(sneaky) + ".log"]
    assert not any(p.name == "escaped" for p in tmp_path.rglob("*"))
    assert json.loads((shards / written[0]).read_text())["spec"]["shard_id"] == sneaky
    assert (await sup.stop(sneaky)).state == "stopped"


def record(**changes):
    spec = make_spec("tiny/0/0", "-c", "4096", gpus=[0, 1], fingerprint="abc")
    base = dict(pid=4242, pgid=4242, create_time=1700000000.25, spec=spec, endpoint="http://127.0.0.1:9000",
                host="127.0.0.1", port=9000, health="/health", started_at=1700000000.5,
                log=safe_name("tiny/0/0") + ".log", log_offset=120, run="0123abcd0123abcd")
    base.update(changes)
    return Record(**base)


def test_a_record_reads_back_as_written(tmp_path):
    files = StateDir(tmp_path)
    written = record()
    path = files.write(written)
    assert path == files.record_path("tiny/0/0")
    assert files.read(path) == written
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_record_rewrite_that_fails_leaves_the_previous_record(tmp_path, monkeypatch):
    files = StateDir(tmp_path)
    path = files.write(record())
    before = path.read_bytes()

    def disk_full(fd, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", disk_full)
    with pytest.raises(OSError, match="No space left"):
        files.write(record(draining=True))
    monkeypatch.undo()
    assert [p.name for p in path.parent.iterdir()] == [path.name]
    assert path.read_bytes() == before and not files.read(path).draining


@pytest.mark.parametrize("damage, named", [
    (lambda d: d.pop("spec"), "spec"),
    (lambda d: d["spec"].update(gpus="0,1"), "spec.gpus"),
    (lambda d: d.update(port="9000"), "port"),
    (lambda d: d.update(create_time=None), "create_time"),
    (lambda d: d.update(format=99), "format"),
    (lambda d: d.update(log="../../etc/passwd"), "log"),
    (lambda d: d.update(health="health"), "health"),
    (lambda d: d.update(pgid=1), "pgid"),
])
def test_a_damaged_record_names_what_is_wrong_and_the_process_it_named(tmp_path, damage, named):
    files = StateDir(tmp_path)
    path = files.write(record())
    data = json.loads(path.read_text())
    damage(data)
    path.write_text(json.dumps(data))
    with pytest.raises(RecordError) as e:
        files.read(path)
    assert named in str(e.value)
    if named != "create_time":
        assert (e.value.pid, e.value.create_time) == (4242, 1700000000.25)
    else:
        assert e.value.pid is None


def test_a_record_under_another_shards_name_is_refused(tmp_path):
    files = StateDir(tmp_path)
    path = files.write(record())
    other = path.with_name(safe_name("other/0/0") + ".json")
    path.rename(other)
    with pytest.raises(RecordError, match="not this file"):
        files.read(other)


def test_the_follower_joins_partial_lines_and_keeps_the_last(tmp_path):
    log = tmp_path / "x.log"
    log.write_bytes(b"")
    f = LogFollower(log, keep=3)
    with open(log, "ab") as out:
        out.write(b"one\ntw")
        out.flush()
        f.poll()
        assert f.last(10) == ["one"]
        out.write(b"o\r\nthree\nfour\nfi")
        out.flush()
        f.poll()
        assert f.last(10) == ["two", "three", "four"]
    f.finish()
    assert f.last(10) == ["three", "four", "fi"]
    assert f.last(0) == []


def test_the_follower_starts_over_after_copytruncate(tmp_path):
    log = tmp_path / "x.log"
    log.write_bytes(b"a\nb\n")
    f = LogFollower(log, keep=10)
    f.poll()
    log.write_bytes(b"c\n")
    f.poll()
    assert f.last(10) == ["a", "b", "c"]


def test_the_follower_skips_a_flood_and_says_so(tmp_path):
    log = tmp_path / "x.log"
    log.write_bytes(b"x" * 100 + b"\n" + b"line\n" * (MAX_READ_BYTES // 5 + 1000) + b"end\n")
    f = LogFollower(log, keep=5)
    f.poll()
    assert f.last(5)[-1] == "end"
    f2 = LogFollower(log, keep=MAX_READ_BYTES)
    f2.poll()
    assert f2.lines[0].startswith("llmgw: [") and "bytes of output skipped" in f2.lines[0]
    assert set(list(f2.lines)[1:-1]) == {"line"}


def test_read_back_takes_only_this_runs_output(tmp_path):
    log = tmp_path / "x.log"
    log.write_bytes(b"previous run\n")
    offset = log.stat().st_size
    with open(log, "ab") as out:
        out.write(b"this run 1\nthis run 2\n")
    f = LogFollower(log, keep=10, offset=offset)
    assert f.read_back(max_bytes=1 << 20)
    assert f.last(10) == ["this run 1", "this run 2"]
    assert not LogFollower(tmp_path / "missing.log", keep=10).read_back(max_bytes=100)
