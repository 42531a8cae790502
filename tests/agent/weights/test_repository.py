"""Fetching a whole repository from a hub mirror on 127.0.0.1: one directory, whole or not at all."""

from __future__ import annotations

import json
import os

import pytest
import pytest_twisted
from twisted.internet import reactor, task

from llmgw.agent.weights import (
    ChecksumMismatch,
    Fetcher,
    FetchError,
    SizeMismatch,
    cache_name,
    collect,
    parse,
    partial_name,
    scan,
)
from tests.support.hfmirror import HubMirror
from tests.support.wait import until

from .modelserver import Served, model_bytes, sha
from .test_fetch import failure_of

WEIGHTS = model_bytes(1_000_000, seed=1)
TOKENIZER = b'{"model": {"vocab": {}}}'
SOURCE = "hf://acme/tiny-llama"


def tiny_repo(root) -> None:
    repo = root / "acme" / "tiny-llama"
    (repo / "tokenizer").mkdir(parents=True)
    (repo / "config.json").write_text('{"hidden_size": 64, "num_hidden_layers": 2}')
    (repo / "model.safetensors").write_bytes(WEIGHTS)
    (repo / "tokenizer" / "tokenizer.json").write_bytes(TOKENIZER)
    (repo / "README.md").write_text("a tiny random model\n")
    (repo / "empty.txt").write_bytes(b"")


@pytest.fixture
def hub(tmp_path):
    tiny_repo(tmp_path / "hub")
    with HubMirror(tmp_path / "hub", chunk=16 * 1024) as mirror:
        yield mirror


def make(hub, weights_dir, **kw):
    reports = []
    kw.setdefault("environ", {"HF_ENDPOINT": hub.url})
    return Fetcher(reactor, weights_dir, progress=reports.append, **kw), reports


def tree(directory) -> dict[str, bytes]:
    out = {}
    for top, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(top, name)
            out[os.path.relpath(path, directory)] = open(path, "rb").read()
    return out


@pytest_twisted.ensureDeferred
async def test_a_repository_lands_whole_in_one_directory_with_progress_of_the_whole(hub, weights_dir):
    fetcher, reports = make(hub, weights_dir)
    path = await fetcher.fetch(SOURCE)
    assert path == weights_dir / cache_name(SOURCE)
    got = tree(path)
    assert got.pop(".llmgw-repo.json")
    assert got == {"config.json": b'{"hidden_size": 64, "num_hidden_layers": 2}', "model.safetensors": WEIGHTS,
                   "tokenizer/tokenizer.json": TOKENIZER, "README.md": b"a tiny random model\n", "empty.txt": b""}
    assert sorted(os.listdir(weights_dir)) == [cache_name(SOURCE)]  # no .partial left
    total = sum(len(v) for v in got.values())
    final = reports[-1]
    assert final.final and final.error is None and final.source == SOURCE
    assert (final.bytes_done, final.bytes_total) == (total, total)
    assert all(r.bytes_total == total for r in reports)
    # Every file is fetched at the commit the listing gave, so a moving branch cannot mix two revisions.
    commit = listings(hub)[0]["commit"]
    assert {s["revision"] for s in hub.seen() if not s["path"].startswith("/api/")} == {commit}
    # Fetched already: no second listing, no second download.
    listed = len(hub.seen())
    assert await fetcher.fetch(SOURCE) == path
    assert len(hub.seen()) == listed


WEIGHTS_PATH = "acme/tiny-llama/model.safetensors"


def gets(hub, path=WEIGHTS_PATH) -> list[dict]:
    return [s for s in hub.seen(path) if s["method"] == "GET"]


def listings(hub) -> list[dict]:
    return [s for s in hub.seen() if s["path"].startswith("/api/")]


@pytest_twisted.ensureDeferred
async def test_two_shards_share_one_fetch_and_see_bytes_of_the_whole_repository(hub, weights_dir):
    clock = task.Clock()
    fetcher, reports = make(hub, weights_dir, clock=clock, idle_timeout_s=3600)
    hub.hold(WEIGHTS_PATH, 500_000)
    first, second = fetcher.fetch(SOURCE), fetcher.fetch(SOURCE)
    assert fetcher.in_flight() == {SOURCE}
    await until(lambda: hub.reached(WEIGHTS_PATH) == 1, "the weights held at 500 kB")
    # Files are fetched in path order: README.md, config.json and empty.txt came first.
    before = len("a tiny random model\n") + len('{"hidden_size": 64, "num_hidden_layers": 2}')
    total = before + len(WEIGHTS) + len(TOKENIZER)

    def ticked():
        clock.advance(1)
        return reports and reports[-1].bytes_done == before + 500_000 and reports[-1]

    held = await until(ticked, "a progress report at the hold")
    assert (held.bytes_total, held.file_name, held.final) == (total, "tiny-llama", False)
    assert not (weights_dir / cache_name(SOURCE)).exists()
    hub.release(WEIGHTS_PATH)
    assert await first == await second == weights_dir / cache_name(SOURCE)
    assert len(gets(hub)) == 1 and len(listings(hub)) == 1
    assert sum(r.final for r in reports) == 1 and reports[-1].bytes_done == total
    assert fetcher.in_flight() == frozenset()


@pytest_twisted.ensureDeferred
async def test_files_patterns_fetch_only_what_they_allow_into_a_directory_of_their_own(hub, weights_dir):
    fetcher, _ = make(hub, weights_dir)
    patterns = ("*.json", "*.safetensors")
    path = await fetcher.fetch(SOURCE, files=patterns)
    assert path == weights_dir / cache_name(SOURCE, patterns) != weights_dir / cache_name(SOURCE)
    assert sorted(tree(path)) == [".llmgw-repo.json", "config.json", "model.safetensors", "tokenizer/tokenizer.json"]
    assert {s["path"] for s in hub.seen() if s["method"] == "GET" and not s["path"].startswith("/")} == {
        "acme/tiny-llama/config.json", WEIGHTS_PATH, "acme/tiny-llama/tokenizer/tokenizer.json"}
    # A folder pattern allows what is under it.
    assert sorted(tree(await fetcher.fetch(SOURCE, files=["tokenizer/"]))) == [".llmgw-repo.json",
                                                                               "tokenizer/tokenizer.json"]
    error = await failure_of(fetcher.fetch(SOURCE, files=["*.gguf"]))
    assert "acme/tiny-llama at main has no files that the model's files: patterns ['*.gguf'] allow" in str(error)


@pytest_twisted.ensureDeferred
async def test_an_interrupted_file_resumes_and_the_half_directory_is_never_held(hub, weights_dir):
    fetcher, reports = make(hub, weights_dir)
    hub.cut(WEIGHTS_PATH, 600_000)
    error = await failure_of(fetcher.fetch(SOURCE))
    assert isinstance(error, FetchError) and "connection lost after 600000 of 1000000 bytes" in str(error)
    assert reports[-1].final and reports[-1].error == str(error)
    assert os.listdir(weights_dir) == [partial_name(SOURCE)]
    assert scan([weights_dir]) == []  # nothing in a .partial directory is reported as weights
    path = await fetcher.fetch(SOURCE)
    assert tree(path)["model.safetensors"] == WEIGHTS
    first, again = gets(hub)
    assert (again["range"], again["status"], again["sent"]) == ("bytes=600000-", 206, 400_000)
    # The files finished before the cut were not fetched again.
    assert len(gets(hub, "acme/tiny-llama/config.json")) == 1
    assert os.listdir(weights_dir) == [cache_name(SOURCE)]


@pytest_twisted.ensureDeferred
async def test_a_file_whose_bytes_do_not_match_the_listing_is_refused_by_name(hub, weights_dir):
    fetcher, _ = make(hub, weights_dir)
    hub.corrupt(WEIGHTS_PATH)
    error = await failure_of(fetcher.fetch(SOURCE))
    assert isinstance(error, ChecksumMismatch)
    assert str(error).startswith("model.safetensors from ") and "the download was deleted" in str(error)
    assert not (weights_dir / cache_name(SOURCE)).exists()
    staged = weights_dir / partial_name(SOURCE)
    assert not (staged / "model.safetensors").exists() and not (staged / "model.safetensors.partial").exists()


@pytest_twisted.ensureDeferred
async def test_a_split_gguf_keeps_its_part_names_beside_each_other(tmp_path, weights_dir):
    repo = tmp_path / "hub" / "acme" / "big-GGUF" / "Q4_K_M"
    repo.mkdir(parents=True)
    parts = {f"Q4_K_M/big-Q4_K_M-{i:05d}-of-00003.gguf": model_bytes(70_000, seed=i) for i in (1, 2, 3)}
    for name, data in parts.items():
        (tmp_path / "hub" / "acme" / "big-GGUF" / name).write_bytes(data)
    (repo / "big-Q8_0.gguf").write_bytes(b"not wanted")
    with HubMirror(tmp_path / "hub") as hub:
        fetcher, reports = make(hub, weights_dir)
        source = "hf://acme/big-GGUF/Q4_K_M/big-Q4_K_M-00001-of-00003.gguf"
        path = await fetcher.fetch(source)
    assert path == weights_dir / cache_name(source) / "Q4_K_M" / "big-Q4_K_M-00001-of-00003.gguf"
    got = tree(weights_dir / cache_name(source))
    got.pop(".llmgw-repo.json")
    assert got == parts
    assert reports[-1].bytes_done == reports[-1].bytes_total == 210_000
    with pytest.raises(ValueError, match="name the first part, big-00001-of-00003.gguf"):
        parse("hf://acme/big-GGUF/big-00002-of-00003.gguf")


@pytest_twisted.ensureDeferred
async def test_hf_token_is_sent_for_the_listing_and_every_file(tmp_path, weights_dir):
    tiny_repo(tmp_path / "hub")
    with HubMirror(tmp_path / "hub", token="hf_secret") as hub:
        fetcher, _ = make(hub, weights_dir)
        error = await failure_of(fetcher.fetch(SOURCE))
        assert "HTTP 401" in str(error) and "set HF_TOKEN in the agent's environment" in str(error)
        fetcher, _ = make(hub, weights_dir, environ={"HF_ENDPOINT": hub.url, "HF_TOKEN": "hf_secret"})
        await fetcher.fetch(SOURCE)
        assert {s["authorization"] for s in hub.seen() if s["status"] in (200, 206)} == {"Bearer hf_secret"}


@pytest_twisted.ensureDeferred
async def test_a_missing_revision_is_named(hub, weights_dir):
    fetcher, _ = make(hub, weights_dir)
    error = await failure_of(fetcher.fetch("hf://acme/tiny-llama@v9"))
    assert "acme/tiny-llama has no revision v9: check the source's @REVISION" in str(error)
    error = await failure_of(fetcher.fetch("hf://acme/absent"))
    assert "there is no repository acme/absent" in str(error)
    assert os.listdir(weights_dir) == []  # a refused listing leaves no empty .partial behind


COMMIT = "c" * 40
LISTING = "/api/models/acme/evil/revision/main"


def listing_of(*siblings, sha=COMMIT) -> bytes:
    return json.dumps({"id": "acme/evil", "sha": sha, "siblings": list(siblings)}).encode()


def one(name, size=10, **more) -> dict:
    return {"rfilename": name, "size": size, **more}


HOSTILE = {
    "a path that climbs out": (listing_of(one("../../outside.txt")), "'.' or '..' segment"),
    "an absolute path": (listing_of(one("/etc/cron.d/x")), "is an absolute path"),
    "a dot segment": (listing_of(one("a/./b.txt")), "'.' or '..' segment"),
    "a control character": (listing_of(one("a\nb.txt")), "control character"),
    "a backslash": (listing_of(one("..\\..\\x")), "backslash"),
    "too deep": (listing_of(one("/".join("d" * 10) + "/x")), "more than 8 folders deep"),
    "a .partial name": (listing_of(one("model.safetensors.partial")), "ends in .partial"),
    "a name twice": (listing_of(one("a.txt"), one("a.txt")), "names a.txt twice"),
    "a file that is a folder too": (listing_of(one("a"), one("a/b.txt")), "names a as both a file and a folder"),
    "no size": (listing_of({"rfilename": "a.txt"}), "gives a.txt the size None"),
    "a negative size": (listing_of(one("a.txt", -1)), "gives a.txt the size -1"),
    "a size that is true": (listing_of(one("a.txt", True)), "gives a.txt the size True"),
    "a petabyte and more": (listing_of(one("a.bin", (1 << 50) + 1)), "needs a whole number of bytes"),
    "an LFS sha256 that is not one": (listing_of(one("a.bin", lfs={"sha256": "zz", "size": 10})), "not 64 hex"),
    "two sizes": (listing_of(one("a.bin", lfs={"sha256": "a" * 64, "size": 11})), "two sizes, 10 and 11"),
    "a commit that is not one": (listing_of(one("a.txt"), sha="main; rm -rf /"), "not 40 hex digits"),
    "no file list": (json.dumps({"sha": COMMIT}).encode(), "has no list of files"),
    "not JSON": (b"<html>", "is not JSON"),
    "too many files": (listing_of(*(one(f"f{i}.txt") for i in range(4))), "has 4 files, over the limit of 3"),
    "a name too long": (listing_of(one("a" * 256)), "has a segment over 255 bytes"),
    "a listing too long": (listing_of(*(one(c * 200 + ".txt") for c in "abc")), "is over 600 bytes"),
}


@pytest.mark.parametrize("body, refusal", HOSTILE.values(), ids=HOSTILE.keys())
@pytest_twisted.ensureDeferred
async def test_a_hostile_listing_is_refused_before_a_byte_is_fetched(http, tmp_path, weights_dir, body, refusal):
    http.files[LISTING] = Served(body)
    fetcher = Fetcher(reactor, weights_dir, environ={"HF_ENDPOINT": http.base}, max_files=3, max_listing_bytes=600)
    error = await failure_of(fetcher.fetch("hf://acme/evil"))
    assert isinstance(error, FetchError) and refusal in str(error), str(error)
    assert str(error).startswith("the hub's listing of acme/evil")
    assert [s.path for s in http.seen] == [LISTING]  # nothing else was asked for
    assert os.listdir(weights_dir) == [] and sorted(os.listdir(tmp_path)) == ["llmgw-weights"]


@pytest_twisted.ensureDeferred
async def test_a_file_longer_than_its_listing_says_is_refused(http, weights_dir):
    http.files[LISTING] = Served(listing_of(one("config.json", 10), one("a.bin", 100)))
    http.files[f"/acme/evil/resolve/{COMMIT}/config.json"] = Served(b"0123456789")
    http.files[f"/acme/evil/resolve/{COMMIT}/a.bin"] = Served(model_bytes(200))
    fetcher = Fetcher(reactor, weights_dir, environ={"HF_ENDPOINT": http.base})
    error = await failure_of(fetcher.fetch("hf://acme/evil"))
    assert isinstance(error, SizeMismatch) and "a.bin is 200 bytes, expected 100" in str(error)
    assert not (weights_dir / cache_name("hf://acme/evil")).exists()


@pytest_twisted.ensureDeferred
async def test_a_repository_over_the_size_limit_is_refused_whole(http, weights_dir):
    http.files[LISTING] = Served(listing_of(one("a.bin", 600), one("b.bin", 600)))
    fetcher = Fetcher(reactor, weights_dir, environ={"HF_ENDPOINT": http.base}, max_bytes=1000)
    error = await failure_of(fetcher.fetch("hf://acme/evil"))
    assert "hf://acme/evil is 1200 bytes in 2 files, over the limit of 1000" in str(error)
    assert [s.path for s in http.seen] == [LISTING]


@pytest_twisted.ensureDeferred
async def test_a_fetched_repository_is_collected_whole_and_an_operators_file_in_it_stops_that(hub, weights_dir):
    fetcher, _ = make(hub, weights_dir)
    path = await fetcher.fetch(SOURCE)
    (path / "my-notes.txt").write_text("the operator's")
    refused = collect(weights_dir, [str(path)])
    assert "holds my-notes.txt, which llmgw did not fetch" in refused.refused[str(path)]
    (path / "my-notes.txt").unlink()
    assert collect(weights_dir, [str(path)]).removed == [str(path)]
    assert os.listdir(weights_dir) == []


# -- the sha256 the hub sends with an LFS file (X-Linked-Etag) --


@pytest_twisted.ensureDeferred
async def test_an_hf_file_is_checked_against_the_sha256_the_hub_sends_even_without_one_in_the_catalog(hub, weights_dir):
    fetcher, _ = make(hub, weights_dir)
    assert (await fetcher.fetch(f"{SOURCE}/model.safetensors")).read_bytes() == WEIGHTS
    hub.corrupt(WEIGHTS_PATH)
    error = await failure_of(fetcher.fetch(f"{SOURCE}@main/model.safetensors"))  # another source, same file
    assert isinstance(error, ChecksumMismatch) and "the hub (X-Linked-Etag) says" in str(error)
    assert not (weights_dir / cache_name(f"{SOURCE}@main/model.safetensors")).exists()


@pytest_twisted.ensureDeferred
async def test_a_catalog_sha256_the_hub_contradicts_is_refused_before_the_bytes(http, other_http, weights_dir):
    data = model_bytes(100_000)
    http.files["/acme/x/resolve/main/m.gguf"] = Served(redirect=other_http.url("/cdn/m.gguf"),
                                                        headers={"X-Linked-Etag": f'"{sha(data)}"'})
    other_http.files["/cdn/m.gguf"] = Served(data[:-1] + b"!")
    fetcher = Fetcher(reactor, weights_dir, environ={"HF_ENDPOINT": http.base})
    error = await failure_of(fetcher.fetch("hf://acme/x/m.gguf"))  # no sha256: the hub's, on its redirect
    assert isinstance(error, ChecksumMismatch) and f"the hub (X-Linked-Etag) says {sha(data)}" in str(error)
    error = await failure_of(fetcher.fetch("hf://acme/x/m.gguf", sha256="a" * 64))
    assert f"the hub says its sha256 is {sha(data)}, the catalog says {'a' * 64}; nothing was kept" in str(error)
    assert os.listdir(weights_dir) == []


@pytest_twisted.ensureDeferred
async def test_a_second_agent_on_the_same_directory_waits_for_the_first_and_fetches_nothing(hub, weights_dir):
    first, _ = make(hub, weights_dir)
    clock = task.Clock()
    second, _ = make(hub, weights_dir, clock=clock)  # another process on a filer: its own Fetcher
    hub.hold(WEIGHTS_PATH, 500_000)
    fetching = first.fetch(SOURCE)
    await until(lambda: hub.reached(WEIGHTS_PATH) == 1, "the first agent's download held")
    waiting = second.fetch(SOURCE)
    await until(lambda: clock.getDelayedCalls(), "the second agent to wait on the lock")
    assert not waiting.called
    hub.release(WEIGHTS_PATH)
    path = await fetching
    clock.advance(5)  # the second looks again, and finds the directory whole
    assert await waiting == path
    assert len(gets(hub)) == 1 and len(listings(hub)) == 1


@pytest_twisted.ensureDeferred
async def test_a_resume_after_the_branch_moved_starts_afresh(hub, tmp_path, weights_dir):
    fetcher, _ = make(hub, weights_dir)
    hub.cut(WEIGHTS_PATH, 600_000)
    await failure_of(fetcher.fetch(SOURCE))
    (tmp_path / "hub" / "acme" / "tiny-llama" / "config.json").write_text('{"hidden_size": 128}')  # a new commit
    path = await fetcher.fetch(SOURCE)
    assert tree(path)["config.json"] == b'{"hidden_size": 128}' and tree(path)["model.safetensors"] == WEIGHTS
    assert [s["range"] for s in gets(hub)] == [None, None]  # the cut file was fetched again from the start
    first, second = (s["commit"] for s in listings(hub))
    assert first != second and {s["revision"] for s in gets(hub)} == {first, second}


@pytest_twisted.ensureDeferred
async def test_a_repository_takes_no_sha256_and_a_file_no_files_patterns(hub, weights_dir):
    fetcher, _ = make(hub, weights_dir)
    error = await failure_of(fetcher.fetch(SOURCE, sha256="a" * 64))
    assert "hf://acme/tiny-llama is a repository: its files are checked against the hub's listing; " \
           "remove the model's sha256" in str(error)
    error = await failure_of(fetcher.fetch(f"{SOURCE}/config.json", files=["*.json"]))
    assert "is not a repository (hf://ORG/REPO): files: patterns choose files of a repository only" in str(error)
    assert hub.seen() == []
