"""The journal on disk: appended at the turn's end, rotated within its bound, read back whatever the files hold."""

from __future__ import annotations

import json
import os

import pytest
from twisted.internet.task import Clock

from llmgw.config.history import HistorySettings
from llmgw.control.journal import Journal
from llmgw.control.journalfile import NAME
from llmgw.history import JournalKind

K = JournalKind


@pytest.fixture
def clock():
    c = Clock()
    c.advance(1_800_000_000)
    return c


def journal(clock, directory, **settings) -> Journal:
    return Journal(clock, HistorySettings(**{"journal_refill_s": 0, **settings}), str(directory))


def lines(path) -> list[dict]:
    return [json.loads(line) for line in open(path, "rb").read().splitlines()]


def test_entries_are_written_at_the_end_of_the_turn_and_read_back_after_a_restart(clock, tmp_path):
    j = journal(clock, tmp_path / "history")
    j.record(K.NODE_REGISTERED, "node01", "from 10.0.0.5", node="node01")
    j.record(K.EXITED, "echo/0", "killed by signal 9 (SIGKILL)", node="node01", model="echo", replica="echo/0")
    assert not (tmp_path / "history" / NAME).exists()  # nothing written inside the turn
    clock.advance(0)
    assert [e["seq"] for e in lines(tmp_path / "history" / NAME)] == [1, 2]

    again = journal(clock, tmp_path / "history")
    assert (again.restored, again.skipped) == (2, 0)
    assert again.page().entries == j.page().entries
    assert again.record(K.SERVER_STARTED, "server").seq == 3  # numbers go on across a restart


def test_the_file_rotates_and_the_files_together_hold_their_bound(clock, tmp_path):
    file_bytes, files = 65536, 2
    j = journal(clock, tmp_path, journal_file_bytes=file_bytes, journal_files=files, journal_entries=100_000)
    for i in range(3000):
        j.record(K.FAILED, f"echo/{i}", "exited with code 1 " * 5, node="node01")
        if i % 100 == 0:
            clock.advance(0)
    clock.advance(0)
    names = sorted(os.listdir(tmp_path))
    assert names == [NAME, f"{NAME}.1", f"{NAME}.2"]
    sizes = [os.path.getsize(tmp_path / n) for n in names]
    assert all(size <= file_bytes for size in sizes)
    # What is on disk is the newest entries, without a gap, the newest file last.
    seqs = [e["seq"] for n in reversed(names) for e in lines(tmp_path / n)]
    assert seqs == list(range(seqs[0], 3001))
    again = journal(clock, tmp_path, journal_file_bytes=file_bytes, journal_files=files, journal_entries=100_000)
    assert [e.seq for e in again.page(limit=10_000).entries] == seqs
    assert again.page().dropped == seqs[0] - 1


def test_no_rotated_files_keeps_the_current_one_alone(clock, tmp_path):
    j = journal(clock, tmp_path, journal_file_bytes=65536, journal_files=0)
    for i in range(2000):
        j.record(K.FAILED, f"echo/{i}", "z" * 100)
        clock.advance(0)
    assert os.listdir(tmp_path) == [NAME]
    assert os.path.getsize(tmp_path / NAME) <= 65536


def test_read_back_keeps_only_journal_entries_from_the_newest_files(clock, tmp_path):
    j = journal(clock, tmp_path, journal_file_bytes=65536, journal_files=3)
    for i in range(2000):
        j.record(K.FAILED, f"echo/{i}", "w" * 80)
    clock.advance(0)
    again = journal(clock, tmp_path, journal_file_bytes=65536, journal_files=3, journal_entries=100)
    assert [e.seq for e in again.page(limit=1000).entries] == list(range(1901, 2001))


def test_a_torn_last_line_is_skipped_counted_and_written_after(clock, tmp_path):
    j = journal(clock, tmp_path)
    j.record(K.NODE_LOST, "node01", node="node01")
    clock.advance(0)
    with open(tmp_path / NAME, "ab") as f:
        f.write(b'{"seq":2,"at":1800000000.0,"kind":"node lo')  # the server died mid-write
    again = journal(clock, tmp_path)
    assert (again.restored, again.skipped) == (1, 1)
    again.record(K.SERVER_STARTED, "server", "restarted")
    clock.advance(0)
    third = journal(clock, tmp_path)
    assert [e.seq for e in third.page().entries] == [1, 2]
    assert third.page().entries[-1].reason == "restarted"
    assert third.skipped == 1  # the torn line stays alone on its line, the new entry whole after it


@pytest.mark.parametrize("hostile", [
    b"not json at all",
    b'{"seq": "one", "at": 1, "kind": "node lost", "subject": "x"}',
    b'{"seq": 5, "at": 1, "kind": "a kind nobody knows", "subject": "x"}',
    b'{"seq": 5, "at": 1, "kind": "node lost", "subject": "x\\u001b[2J"}',
    b'{"seq": 5, "at": 1, "kind": "node lost", "subject": "x", "reason": "' + b"r" * 70_000 + b'"}',
    b"[" * 100_000,
    b'{"seq": 1, "at": 1, "kind": "node lost", "subject": "x"}',  # a seq that goes back
    b"\xff\xfe\x00",
])
def test_a_line_that_is_not_an_entry_is_skipped_and_counted_never_fatal(clock, tmp_path, hostile):
    j = journal(clock, tmp_path)
    j.record(K.NODE_LOST, "node01", node="node01")
    j.record(K.NODE_BACK, "node01", node="node01")
    clock.advance(0)
    with open(tmp_path / NAME, "ab") as f:
        f.write(hostile + b"\n")
    again = journal(clock, tmp_path)
    assert (again.restored, again.skipped) == (2, 1)
    assert again.record(K.SERVER_STARTED, "server").seq == 3


def test_a_directory_that_cannot_be_written_is_said_once_and_the_journal_goes_on_in_memory(clock, tmp_path):
    from twisted.logger import globalLogPublisher

    blocked = tmp_path / "a-file"
    blocked.write_text("in the way")
    said = []
    observer = said.append
    globalLogPublisher.addObserver(observer)
    try:
        j = journal(clock, blocked / "history")
        for i in range(3):
            j.record(K.NODE_LOST, f"node{i}", node=f"node{i}")
            clock.advance(0)
    finally:
        globalLogPublisher.removeObserver(observer)
    warnings = [e for e in said if "cannot write" in e.get("log_format", "")]
    assert len(warnings) == 1
    assert str(blocked / "history") in warnings[0]["dir"]
    assert [e.seq for e in j.page().entries] == [1, 2, 3]


def test_without_a_directory_the_journal_is_memory_only(clock):
    j = Journal(clock, HistorySettings(), None)
    assert j.record(K.SERVER_STARTED, "server").seq == 1
    assert (j.restored, j.file) == (0, None)


@pytest.mark.parametrize("what", ["fifo", "endless"])
def test_a_rotated_file_that_is_no_file_is_not_read_and_the_server_starts(clock, tmp_path, what):
    j = journal(clock, tmp_path, journal_file_bytes=65536)
    j.record(K.NODE_LOST, "node01", node="node01")
    clock.advance(0)
    rotated = tmp_path / f"{NAME}.1"
    if what == "fifo":
        os.mkfifo(rotated)  # opening it to read would wait for a writer for ever
    else:
        os.symlink("/dev/zero", rotated)  # reading it to its end would never end
    again = journal(clock, tmp_path, journal_file_bytes=65536)
    assert again.restored == 1 and again.record(K.SERVER_STARTED, "server").seq == 2
