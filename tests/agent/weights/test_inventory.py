"""What a node says it holds: real files only, sent again only when that changes."""

from __future__ import annotations

import pytest

from llmgw.agent.weights import (
    CollectResult,
    InventoryWatch,
    Progress,
    WeightsFile,
    WeightsReport,
    cache_name,
    fingerprint,
    model_directories,
    partial_name,
    scan,
)
from llmgw.wire import from_wire, to_wire


@pytest.fixture
def dirs(tmp_path):
    fetched, filer = tmp_path / "llmgw-weights", tmp_path / "filer"
    fetched.mkdir()
    filer.mkdir()
    return fetched, filer


def paths(files):
    return [f.path for f in files]


def test_files_with_bytes_are_weights_and_nothing_else_is(dirs, tmp_path):
    fetched, filer = dirs
    done = fetched / cache_name("https://h/a.gguf")
    done.write_bytes(b"x" * 100)
    (fetched / partial_name("https://h/b.gguf")).write_bytes(b"half")  # a download still running
    (fetched / "empty.gguf").write_bytes(b"")  # an interrupted copy looks like this
    (filer / "qwen").mkdir()
    (filer / "qwen" / "model.safetensors").write_bytes(b"y" * 7)
    for other in (".hidden.gguf", "model.gguf.part", "model.gguf.tmp", "x.incomplete", "dl.crdownload",
                  "notes.gguf~", "x.lock"):
        (filer / other).write_bytes(b"z")
    (filer / ".cache").mkdir()
    (filer / ".cache" / "blob").write_bytes(b"z")
    files = scan([fetched, filer, tmp_path / "not-mounted"])
    assert files == [WeightsFile(str(done), 100), WeightsFile(str(filer / "qwen" / "model.safetensors"), 7)]


def test_links_to_files_count_as_what_they_point_at_and_linked_dirs_are_not_entered(dirs, tmp_path):
    fetched, filer = dirs
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "big.gguf").write_bytes(b"b" * 50)
    (filer / "model.gguf").symlink_to(elsewhere / "big.gguf")
    (filer / "dangling.gguf").symlink_to(tmp_path / "nothing")
    (filer / "tree").symlink_to(elsewhere)
    (filer / "loop").symlink_to(filer)
    assert scan([filer]) == [WeightsFile(str(filer / "model.gguf"), 50)]


def test_each_path_once_and_a_depth_limit(dirs):
    fetched, _ = dirs
    deep = fetched
    for i in range(12):
        deep = deep / f"d{i}"
    deep.mkdir(parents=True)
    (deep / "too-deep.gguf").write_bytes(b"1")
    (fetched / "d0" / "shallow.gguf").write_bytes(b"1")
    files = scan([fetched, fetched, fetched / "d0"])
    assert paths(files) == [str(fetched / "d0" / "shallow.gguf")]


def test_the_fingerprint_changes_when_a_file_appears_or_grows_and_not_otherwise(dirs):
    fetched, _ = dirs
    empty = fingerprint(scan([fetched]))
    model = fetched / "m.gguf"
    model.write_bytes(b"a" * 10)
    one = fingerprint(scan([fetched]))
    assert one != empty
    assert fingerprint(scan([fetched])) == one
    model.write_bytes(b"a" * 11)
    grown = fingerprint(scan([fetched]))
    assert grown not in (one, empty)
    (fetched / "n.gguf").write_bytes(b"b")
    assert fingerprint(scan([fetched])) not in (grown, one, empty)
    a, b = WeightsFile("/a", 1), WeightsFile("/b", 2)
    assert fingerprint([a, b]) == fingerprint([b, a])
    assert fingerprint([WeightsFile("/a", 12)]) != fingerprint([WeightsFile("/a1", 2)])


def test_a_watch_reports_the_first_scan_and_then_only_changes(dirs):
    fetched, _ = dirs
    watch = InventoryWatch(cache_dir=fetched)
    first = watch.report(scan([fetched]))
    # Empty, and meant: "this node holds nothing", not "nothing to report".
    assert first == WeightsReport(files=[], fingerprint=fingerprint([]), listed=True, cache_dir=str(fetched))
    assert watch.report(scan([fetched])) is None
    (fetched / "m.gguf").write_bytes(b"a")
    changed = watch.report(scan([fetched]))
    assert changed.listed and paths(changed.files) == [str(fetched / "m.gguf")]
    assert watch.report(scan([fetched])) is None
    watch.reset()  # a new link session knows nothing: say it all again
    assert watch.report(scan([fetched])) == changed


@pytest.mark.parametrize("record", [
    WeightsReport(files=[WeightsFile("/w/a.gguf", 3)], fingerprint="ab", listed=True, cache_dir="/w"),
    WeightsReport(files=[WeightsFile("/w/q/config.json", 3)], fingerprint="ab", listed=True, cache_dir="/w",
                  directories=[WeightsFile("/w/q", 3)]),
    WeightsReport(),
    Progress(source="hf://o/r/m.gguf", file_name="m.gguf", bytes_done=5, bytes_total=None, rate_bps=None),
    Progress(source="https://h/m", file_name="m", bytes_done=5, bytes_total=9, rate_bps=2.5, final=True,
             error="boom"),
    CollectResult(removed=["/w/x"], refused={"/etc/passwd": "refused /etc/passwd: outside /w"}),
])
def test_the_records_cross_the_link(record):
    assert from_wire(type(record), to_wire(record)) == record


def test_a_report_from_an_older_agent_says_nothing_about_what_it_holds():
    # Absent is not zero: a report without the flag is no claim that the node is empty.
    old = from_wire(WeightsReport, {})
    assert old.listed is False and old.fingerprint is None


def test_model_directories_are_fetched_repositories_and_folders_a_loader_can_open(tmp_path):
    cache, filer = tmp_path / "llmgw-weights", tmp_path / "filer"
    parts = cache / cache_name("hf://o/big/big-00001-of-00002.gguf")  # no config.json, but llmgw fetched it
    for name, size in (("big-00001-of-00002.gguf", 10), ("big-00002-of-00002.gguf", 20)):
        (parts / "q4").mkdir(parents=True, exist_ok=True)
        (parts / "q4" / name).write_bytes(b"g" * size)
    diffusion = filer / "sd"  # a config.json in a subfolder makes that folder a model too
    (diffusion / "unet").mkdir(parents=True)
    (diffusion / "unet" / "config.json").write_text("{}")
    (diffusion / "model_index.json").write_text("{}")
    split = filer / "hand-copied"
    split.mkdir()
    (split / "x-00001-of-00002.gguf").write_bytes(b"a")
    (split / "x-00002-of-00002.gguf").write_bytes(b"bb")
    (filer / "loose.gguf").write_bytes(b"x")
    staged = cache / partial_name("hf://o/next")
    staged.mkdir()
    (staged / "config.json").write_text("{}")
    found = model_directories(scan([cache, filer]), cache)
    assert [(d.path, d.size_bytes) for d in found] == [
        (str(filer / "hand-copied"), 3), (str(diffusion / "unet"), 2), (str(parts), 30), (str(parts / "q4"), 30)]
    # Without the cache directory, by content only: the fetched one is known by its first part's folder.
    assert model_directories(scan([cache, filer])) == [found[0], found[1], found[3]]


def test_a_file_whose_path_the_link_would_refuse_is_not_reported_so_the_report_still_lands(dirs):
    fetched, filer = dirs
    (filer / "good.gguf").write_bytes(b"x")
    (filer / "evil\n.gguf").write_bytes(b"x")  # a line of its own in the server's log
    (filer / "trailing.gguf ").write_bytes(b"x")
    (filer / "a\x1b[2Jdir").mkdir()
    (filer / "a\x1b[2Jdir" / "model.gguf").write_bytes(b"x")
    files = scan([filer])
    assert paths(files) == [str(filer / "good.gguf")]
    report = WeightsReport(files=files, fingerprint=fingerprint(files))
    assert from_wire(WeightsReport, to_wire(report)) == report
