"""The hub mirror's own promises: huggingface_hub downloads from it as from the hub, and a held download stays held."""

from __future__ import annotations

import hashlib
import http.client
import json
import subprocess
import threading
import urllib.error
import urllib.request

import pytest

from tests.agent.weights.modelserver import model_bytes
from tests.support.hfmirror import HubMirror
from tests.support.wait import wait_for

WEIGHTS = model_bytes(300_000)


@pytest.fixture
def hub(tmp_path):
    repo = tmp_path / "hub" / "acme" / "tiny"
    (repo / "tokenizer").mkdir(parents=True)
    (repo / "config.json").write_text('{"hidden_size": 64}')
    (repo / "model.safetensors").write_bytes(WEIGHTS)
    (repo / "tokenizer" / "vocab.txt").write_text("a\nb\n")
    with HubMirror(tmp_path / "hub", page_size=2) as mirror:
        yield mirror


def get(url: str, **headers) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_the_tree_is_paged_and_lfs_files_carry_their_sha256(hub):
    entries, url = [], f"{hub.url}/api/models/acme/tiny/tree/main?recursive=true"
    while url:
        status, headers, body = get(url)
        assert status == 200
        entries += json.loads(body)
        link = headers.get("Link")
        url = link.split(">")[0].lstrip("<") if link else None
    files = {e["path"]: e for e in entries if e["type"] == "file"}
    assert sorted(files) == ["config.json", "model.safetensors", "tokenizer/vocab.txt"]
    assert [e["path"] for e in entries if e["type"] == "directory"] == ["tokenizer"]
    assert files["model.safetensors"]["lfs"] == {"oid": hashlib.sha256(WEIGHTS).hexdigest(), "size": len(WEIGHTS),
                                                 "pointerSize": files["model.safetensors"]["lfs"]["pointerSize"]}
    assert "lfs" not in files["config.json"]
    status, headers, _ = get(f"{hub.url}/acme/tiny/resolve/main/model.safetensors", Range="bytes=299990-")
    assert status == 206 and headers["Content-Range"] == "bytes 299990-299999/300000"
    assert headers["X-Linked-Etag"] == f'"{hashlib.sha256(WEIGHTS).hexdigest()}"'
    assert get(f"{hub.url}/api/models/acme/tiny/revision/nope")[1]["X-Error-Code"] == "RevisionNotFound"
    assert get(f"{hub.url}/api/models/acme/other")[0] == 404


@pytest.mark.vllm
@pytest.mark.slow
def test_huggingface_hub_downloads_a_snapshot_from_the_mirror(hub, vllm_python, tmp_path):
    code = ("import sys, os\nfrom huggingface_hub import snapshot_download\n"
            "p = snapshot_download('acme/tiny', cache_dir=sys.argv[1])\n"
            "print(sorted(os.path.relpath(os.path.join(r, f), p) for r, _, fs in os.walk(p) for f in fs))\n")
    env = {"HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_XET": "1",
           "HF_HOME": str(tmp_path / "hf-home"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([vllm_python, "-c", code, str(tmp_path / "cache")], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "['config.json', 'model.safetensors', 'tokenizer/vocab.txt']"
    assert {s["path"] for s in hub.seen() if s["method"] == "GET" and not s["path"].startswith("/api/")} == {
        "acme/tiny/config.json", "acme/tiny/model.safetensors", "acme/tiny/tokenizer/vocab.txt"}


def test_a_held_download_stops_until_released_and_a_cut_one_ends_early(hub):
    path = "acme/tiny/model.safetensors"
    hub.hold(path, 100_000)
    got = bytearray()

    def read():
        with urllib.request.urlopen(f"{hub.url}/acme/tiny/resolve/main/model.safetensors", timeout=10) as r:
            while piece := r.read(10_000):
                got.extend(piece)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    wait_for(lambda: hub.reached(path) == 1 and len(got) == 100_000, 10, "the first 100 kB, then the stop",
             detail=lambda: f"{len(got)} bytes read")
    hub.release(path)
    reader.join(10)
    assert bytes(got) == WEIGHTS
    hub.cut(path, 50_000)
    status, _, body = get(f"{hub.url}/acme/tiny/resolve/main/model.safetensors", Range="bytes=200000-")
    assert status == 206 and body == WEIGHTS[200_000:]  # the cut lies before this range: nothing to cut
    with pytest.raises(http.client.IncompleteRead):
        get(f"{hub.url}/acme/tiny/resolve/main/model.safetensors")
    assert hub.seen(path)[-1]["sent"] == 50_000


def test_a_token_is_required_when_the_mirror_has_one(tmp_path):
    (tmp_path / "hub" / "acme" / "gated").mkdir(parents=True)
    (tmp_path / "hub" / "acme" / "gated" / "config.json").write_text("{}")
    with HubMirror(tmp_path / "hub", token="hf_secret") as hub:
        url = f"{hub.url}/acme/gated/resolve/main/config.json"
        assert get(url)[0] == 401
        assert get(url, Authorization="Bearer hf_secret")[2] == b"{}"
