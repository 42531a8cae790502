"""Garbage collection of weights: the node removes only what llmgw fetched, however it is asked.

The requests below are what a wrong, newer or tampered-with control plane
could send.  Every one is made against real files and links in a temporary
directory, and every refusal must say why in words.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import attrs
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from llmgw.agent.weights import WeightsFile, collect
from llmgw.control.weights import unwanted
from llmgw.weightnames import cache_name, is_cache_name, partial_name

FETCHED = cache_name("https://mirror.lab/old.gguf")
LINK_OUT = cache_name("https://mirror.lab/link-out.gguf")
LINK_IN = cache_name("https://mirror.lab/link-in.gguf")
A_DIR = cache_name("https://mirror.lab/dir.gguf")
IN_SUB = cache_name("https://mirror.lab/sub.gguf")
ELSEWHERE = cache_name("https://mirror.lab/elsewhere.gguf")
GONE = cache_name("https://mirror.lab/gone.gguf")


@attrs.frozen
class Disk:
    root: Path
    cache: Path  # the weights directory as configured (a link to real_cache when linked)
    real_cache: Path
    outside: Path

    def survivors(self) -> dict[str, bool]:
        """Everything that must still be there after any collect, and whether it is."""
        keep = [self.real_cache / "operator.gguf", self.outside / "victim.gguf", self.outside / ELSEWHERE,
                self.real_cache / "sub" / IN_SUB, self.real_cache / A_DIR, self.real_cache / partial_name("x")]
        links = [self.real_cache / LINK_OUT, self.real_cache / LINK_IN, self.real_cache / "escape"]
        found = {str(p): p.exists() for p in keep}
        found.update({str(p): os.path.lexists(p) for p in links})
        return found


def make_disk(root: Path, linked: bool = False) -> Disk:
    """A weights directory holding one fetched file and every kind of thing that must not be removed."""
    real_cache = root / ("real-weights" if linked else "llmgw-weights")
    outside = root / "outside"
    real_cache.mkdir()
    outside.mkdir()
    cache = real_cache
    if linked:
        cache = root / "llmgw-weights"
        cache.symlink_to(real_cache)
    (real_cache / FETCHED).write_bytes(b"fetched by llmgw")
    (real_cache / "operator.gguf").write_bytes(b"copied by hand, took a week")
    (real_cache / partial_name("x")).write_bytes(b"half")
    (outside / "victim.gguf").write_bytes(b"somebody's")
    (outside / ELSEWHERE).write_bytes(b"cache-named, but not in the cache")
    (real_cache / LINK_OUT).symlink_to(outside / "victim.gguf")
    (real_cache / LINK_IN).symlink_to(real_cache / FETCHED)
    (real_cache / A_DIR).mkdir()
    (real_cache / "sub").mkdir()
    (real_cache / "sub" / IN_SUB).write_bytes(b"in a subdirectory")
    (real_cache / "escape").symlink_to(outside)
    return Disk(root=root, cache=cache, real_cache=real_cache, outside=outside)


@pytest.fixture
def disk(tmp_path):
    return make_disk(tmp_path)


def test_a_fetched_file_the_catalog_dropped_is_removed(disk):
    result = collect(disk.cache, [str(disk.cache / FETCHED)])
    assert result.removed == [str(disk.cache / FETCHED)] and result.refused == {}
    assert not (disk.cache / FETCHED).exists()
    assert all(disk.survivors().values())


def test_a_link_to_the_cache_dir_is_accepted_in_both_spellings(tmp_path):
    disk = make_disk(tmp_path, linked=True)
    assert collect(disk.cache, [str(disk.cache / FETCHED)]).removed == [str(disk.cache / FETCHED)]
    (disk.real_cache / FETCHED).write_bytes(b"again")
    assert collect(disk.cache, [str(disk.real_cache / FETCHED)]).removed == [str(disk.real_cache / FETCHED)]
    assert all(disk.survivors().values())


REFUSALS = [
    ("operator file", lambda d: str(d.cache / "operator.gguf"), "not a file llmgw fetched (no cache name)"),
    ("unfinished download", lambda d: str(d.cache / partial_name("x")), "no cache name"),
    ("path outside", lambda d: str(d.outside / ELSEWHERE), "outside "),
    ("absolute path elsewhere", lambda d: "/etc/passwd", "outside "),
    ("root", lambda d: "/", "outside "),
    (".. out of the cache", lambda d: f"{d.cache}/../outside/{ELSEWHERE}", "outside "),
    ("many ..", lambda d: f"{d.cache}/" + "../" * 40 + "etc/passwd", "outside "),
    (".. that lands inside", lambda d: f"{d.cache}/sub/../{FETCHED}", "has '..' in it"),
    ("through a linked directory", lambda d: f"{d.cache}/escape/{ELSEWHERE}", "in a subdirectory of"),
    ("symlink out", lambda d: str(d.cache / LINK_OUT), "a symbolic link"),
    ("symlink in", lambda d: str(d.cache / LINK_IN), "a symbolic link"),
    ("directory", lambda d: str(d.cache / A_DIR), "a directory"),
    ("subdirectory", lambda d: str(d.cache / "sub" / IN_SUB), "in a subdirectory of"),
    ("missing", lambda d: str(d.cache / GONE), "no such file"),
    ("relative", lambda d: FETCHED, "not an absolute path"),
    ("relative ..", lambda d: f"../outside/{ELSEWHERE}", "not an absolute path"),
    ("dot", lambda d: f"{d.cache}/./{FETCHED}", "not a plain path"),
    ("double slash", lambda d: f"{d.cache}//{FETCHED}", "not a plain path"),
    ("trailing slash", lambda d: f"{d.cache}/{FETCHED}/", "not a plain path"),
    ("the cache dir itself", lambda d: str(d.cache), "outside "),
    ("empty", lambda d: "", "an empty path"),
    ("NUL byte", lambda d: f"{d.cache}/{FETCHED}\x00.txt", "contains a NUL byte"),
    ("not UTF-8", lambda d: f"{d.cache}/llmgw-\udcff", "not valid UTF-8"),
]


@pytest.mark.parametrize("case, path_of, reason", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_everything_else_is_refused_with_a_reason(disk, case, path_of, reason):
    path = path_of(disk)
    result = collect(disk.cache, [path])
    assert result.removed == []
    assert list(result.refused) == [path]
    assert result.refused[path].startswith(f"refused {path}: ")
    assert reason in result.refused[path], result.refused[path]
    if reason == "outside ":
        assert result.refused[path].endswith(f"outside {disk.cache}")
    assert all(disk.survivors().values()), disk.survivors()
    assert (disk.cache / FETCHED).exists()  # only named requests are ever acted on


@pytest.mark.parametrize("item", [42, None, b"/var/lib/llmgw-weights/x", ["nested"], {"path": "x"}, 3.5])
def test_things_that_are_not_paths_are_refused(disk, item):
    result = collect(disk.cache, [item])
    assert result.removed == []
    ((key, why),) = result.refused.items()
    assert key == repr(item) and why.startswith(f"refused {key}: not a path but {type(item).__name__}")
    assert all(disk.survivors().values())


def test_a_request_that_is_not_a_list_is_refused_whole(disk):
    assert collect(disk.cache, 42).refused == {"42": "refused 42: not a list of paths"}
    # A single string is one path, not a list of one-character paths.
    assert collect(disk.cache, str(disk.cache / FETCHED)).removed == [str(disk.cache / FETCHED)]


def test_a_mixed_request_removes_the_one_and_explains_the_rest(disk):
    asked = [str(disk.cache / FETCHED), "/etc/passwd", str(disk.cache / LINK_OUT), str(disk.cache / FETCHED)]
    result = collect(disk.cache, asked)
    assert result.removed == [str(disk.cache / FETCHED)]
    assert set(result.refused) == {"/etc/passwd", str(disk.cache / LINK_OUT)}


def test_a_missing_cache_dir_refuses_everything(tmp_path):
    gone = tmp_path / "not-mounted"
    result = collect(gone, [str(gone / FETCHED)])
    assert result.removed == []
    assert "the cache directory" in result.refused[str(gone / FETCHED)]


def test_unwanted_lists_fetched_files_no_source_names(tmp_path):
    cache = tmp_path / "w"
    kept, dropped = "hf://org/repo/kept.gguf", "hf://org/repo/dropped.gguf"
    files = [
        WeightsFile(str(cache / cache_name(kept)), 10),
        WeightsFile(str(cache / cache_name(dropped)), 20),
        WeightsFile(str(cache / "operator.gguf"), 30),  # never a candidate, however unreferenced
        WeightsFile(str(tmp_path / "filer" / cache_name("https://x/y.gguf")), 40),
    ]
    wanted = [kept, None, "/srv/models/local.gguf"]
    assert unwanted(files, wanted) == [files[1], files[3]]
    assert unwanted(files, wanted, cache_dir=cache) == [files[1]]
    assert unwanted(files, wanted + [dropped, "https://x/y.gguf"]) == []


def test_a_wanted_source_protects_its_cache_names_with_any_files_patterns(tmp_path):
    repo = "hf://org/repo"
    files = [WeightsFile(str(tmp_path / cache_name(repo, ["*.json"])), 1),
             WeightsFile(str(tmp_path / cache_name("hf://org/other", ["*.json"])), 2)]
    assert unwanted(files, [repo]) == [files[1]]


def test_a_source_this_version_cannot_parse_still_protects_its_file(tmp_path):
    odd = "hf://org/repo/future syntax"
    files = [WeightsFile(str(tmp_path / cache_name(odd)), 1)]
    assert unwanted(files, [odd]) == []


# Hypothesis: arbitrary requests against a real directory never remove what they must not.

SEGMENTS = st.sampled_from(["..", ".", "", FETCHED, LINK_OUT, LINK_IN, A_DIR, IN_SUB, ELSEWHERE, GONE,
                            "operator.gguf", "victim.gguf", "sub", "escape", "outside", "llmgw-weights",
                            "real-weights", "etc", "passwd", "x" * 300, partial_name("x")])
PIECES = st.lists(st.one_of(SEGMENTS, st.text(max_size=20)), max_size=12)


@st.composite
def requests(draw):
    anchor = draw(st.sampled_from(["cache", "real", "root", "outside", "/", "none"]))
    pieces = draw(PIECES)
    return anchor, pieces


def spell(disk: Disk, anchor: str, pieces: list[str]) -> str:
    base = {"cache": str(disk.cache), "real": str(disk.real_cache), "root": str(disk.root),
            "outside": str(disk.outside), "/": "", "none": None}[anchor]
    tail = "/".join(pieces)
    return tail if base is None else f"{base}/{tail}"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(linked=st.booleans(),
       asked=st.lists(st.one_of(requests(), st.text(), st.binary(max_size=8), st.integers()), min_size=1,
                      max_size=6))
def test_no_request_removes_anything_but_a_fetched_file_in_the_cache(linked, asked):
    with tempfile.TemporaryDirectory() as tmp:
        disk = make_disk(Path(tmp), linked=linked)
        paths = [spell(disk, *a) if isinstance(a, tuple) else a for a in asked]
        result = collect(disk.cache, paths)
        event("removed the fetched file" if result.removed else "removed nothing")
        assert all(disk.survivors().values()), disk.survivors()
        allowed = {str(disk.cache / FETCHED), str(disk.real_cache / FETCHED)}
        assert set(result.removed) <= allowed
        assert len(result.removed) <= 1
        for path in result.removed:
            assert is_cache_name(os.path.basename(path))
        if not result.removed:
            assert (disk.real_cache / FETCHED).exists()
        keys = {p if isinstance(p, str) else repr(p) for p in paths}
        assert keys == set(result.removed) | set(result.refused)  # every request is answered
        assert all(why.startswith(f"refused {key}: ") for key, why in result.refused.items())


# -- repositories: a directory llmgw fetched, removed whole or not at all --

REPO = cache_name("hf://acme/tiny")


def fetched_repository(cache: Path, listed=("config.json", "model.safetensors", "tokenizer/vocab.txt")) -> Path:
    """A directory as a repository fetch leaves it: the files, and .llmgw-repo.json listing them."""
    import json

    top = cache / REPO
    for path in listed:
        (top / path).parent.mkdir(parents=True, exist_ok=True)
        (top / path).write_bytes(b"w")
    (top / ".llmgw-repo.json").write_text(json.dumps({"files": [{"path": p, "size": 1} for p in listed]}))
    return top


def test_a_fetched_repository_is_removed_whole(tmp_path):
    fetched_repository(tmp_path)
    assert collect(tmp_path, [str(tmp_path / REPO)]).removed == [str(tmp_path / REPO)]
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("stranger, named", [
    (lambda top: (top / "notes.txt").write_text("mine"), "holds notes.txt, which llmgw did not fetch"),
    (lambda top: (top / "tokenizer" / "extra").mkdir(), "holds tokenizer/extra, which llmgw did not fetch"),
    (lambda top: os.symlink("/etc/passwd", top / "passwd"), "holds passwd, which llmgw did not fetch"),
    (lambda top: (top / ".llmgw-repo.json").unlink(), "a directory without .llmgw-repo.json"),
    (lambda top: (top / ".llmgw-repo.json").write_text('{"files": [{"path": "../../x"}]}'),
     "is not a list of the files llmgw fetched"),
], ids=["an operator's file", "a folder", "a link", "no list", "a list that climbs out"])
def test_a_repository_with_anything_llmgw_did_not_fetch_is_refused_whole(tmp_path, stranger, named):
    top = fetched_repository(tmp_path)
    stranger(top)
    before = sorted(str(p) for p in top.rglob("*"))
    result = collect(tmp_path, [str(top)])
    assert result.removed == [] and named in result.refused[str(top)]
    assert sorted(str(p) for p in top.rglob("*")) == before


def test_a_listed_name_that_is_a_link_loses_the_link_never_its_target(tmp_path):
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"somebody's")
    cache = tmp_path / "cache"
    top = fetched_repository(cache)
    (top / "model.safetensors").unlink()
    os.symlink(outside, top / "model.safetensors")
    assert collect(cache, [str(top)]).removed == [str(top)]
    assert outside.read_bytes() == b"somebody's"


def test_unwanted_proposes_a_fetched_repository_no_source_names():
    from types import SimpleNamespace

    from llmgw.control.weights import unwanted_by_node
    from llmgw.records import Inventory, WeightsReport

    cache = "/w"
    report = WeightsReport(files=[WeightsFile(f"{cache}/{REPO}/config.json", 1)], listed=True, cache_dir=cache,
                           directories=[WeightsFile(f"{cache}/{REPO}", 1)])
    fleet = SimpleNamespace(nodes={"n1": SimpleNamespace(id="n1", inventory=Inventory(node_id="n1", weights=report))})
    assert unwanted_by_node(fleet, []) == {"n1": [WeightsFile(f"{cache}/{REPO}", 1)]}
    assert unwanted_by_node(fleet, ["hf://acme/tiny"]) == {"n1": []}
