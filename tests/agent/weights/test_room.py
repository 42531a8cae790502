"""Room for a download: refused before a byte is fetched when the listing (or the length) is more than the disk holds.

Free space is the filesystem's own (statvfs) where the figure is beyond any
test machine's disk, and a stand-in where a test needs an exact figure; the
servers are real, on 127.0.0.1.
"""

from __future__ import annotations

import os

import pytest
import pytest_twisted
from twisted.internet import reactor, task

from llmgw.agent.weights import Fetcher, FetchError, SizeMismatch, cache_name, partial_name
from llmgw.agent.weights.room import Room
from llmgw.sizes import size_words
from tests.support.wait import until

from .modelserver import Served, model_bytes
from .test_fetch import failure_of
from .test_repository import COMMIT, LISTING, SOURCE, WEIGHTS, WEIGHTS_PATH, gets, hub, listing_of, one  # noqa: F401
from .test_repository import make, tree

HUGE = 1 << 49  # 563 TB: more than the disk of any machine the tests run on


@pytest_twisted.ensureDeferred
async def test_a_listing_larger_than_the_disk_is_refused_in_the_nodes_words_before_a_byte_is_fetched(
        http, weights_dir):
    http.files[LISTING] = Served(listing_of(one("config.json", 10), one("model.safetensors", HUGE)))
    fetcher = Fetcher(reactor, weights_dir, environ={"HF_ENDPOINT": http.base}, node_id="node05")
    error = await failure_of(fetcher.fetch("hf://acme/evil"))
    assert isinstance(error, FetchError)
    free = os.statvfs(weights_dir).f_bavail * os.statvfs(weights_dir).f_frsize
    assert str(error).startswith(f"node05: {weights_dir} has {size_words(free)} free; hf://acme/evil needs "
                                 f"{size_words(HUGE + 10)} more; nothing was downloaded. Free space there"), str(error)
    assert "562,950 GB" in str(error)
    assert [s.path for s in http.seen] == [LISTING]
    assert os.listdir(weights_dir) == []
    assert fetcher.room.held() == 0


@pytest_twisted.ensureDeferred
async def test_a_file_whose_length_is_more_than_the_disk_holds_is_refused_before_its_body(http, weights_dir):
    http.files["/m.gguf"] = Served(model_bytes(200_000), delay=0.01, chunk=1024)
    fetcher = Fetcher(reactor, weights_dir, node_id="node05", free=lambda directory: 150_000)
    error = await failure_of(fetcher.fetch(http.url("/m.gguf")))
    assert str(error).startswith(f"node05: {weights_dir} has 150,000 bytes free; {http.url('/m.gguf')} needs "
                                 "200,000 bytes more; nothing was downloaded"), str(error)
    assert http.seen[0].sent < 200_000
    assert os.listdir(weights_dir) == []  # no empty .partial left


@pytest_twisted.ensureDeferred
async def test_what_the_downloads_under_way_still_need_is_not_room(hub, weights_dir):  # noqa: F811
    # 1.5 MB free; the whole repository is 1,000,090 bytes, the weights alone 1,000,000.
    fetcher, _ = make(hub, weights_dir, node_id="node05", free=lambda directory: 1_500_000,
                      clock=task.Clock(), idle_timeout_s=3600)
    hub.hold(WEIGHTS_PATH, 500_000)
    first = fetcher.fetch(SOURCE)
    await until(lambda: hub.reached(WEIGHTS_PATH) == 1, "the first download held at 500 kB")
    await until(lambda: fetcher.room.held() == 500_024, "the first download's 500 kB written")
    error = await failure_of(fetcher.fetch(SOURCE, files=["*.safetensors"]))
    assert str(error).startswith(f"node05: {weights_dir} has 1.5 MB free, 500,024 bytes of it for downloads "
                                 "under way; hf://acme/tiny-llama needs 1 MB more"), str(error)
    assert len(gets(hub)) == 1  # the second never asked for its weights
    hub.release(WEIGHTS_PATH)
    await first
    assert fetcher.room.held() == 0
    # Once the first is done, its room is no longer held.
    path = await fetcher.fetch(SOURCE, files=["*.safetensors"])
    assert path == weights_dir / cache_name(SOURCE, ["*.safetensors"])


@pytest_twisted.ensureDeferred
async def test_a_resumed_repository_needs_room_only_for_what_it_has_yet_to_fetch(hub, weights_dir):  # noqa: F811
    fetcher, _ = make(hub, weights_dir)
    hub.cut(WEIGHTS_PATH, 600_000)
    await failure_of(fetcher.fetch(SOURCE))
    assert os.listdir(weights_dir) == [partial_name(SOURCE)]
    # 400,024 bytes to come (the weights' rest, the tokenizer); the whole would not fit.
    fetcher, _ = make(hub, weights_dir, free=lambda directory: 450_000)
    path = await fetcher.fetch(SOURCE)
    assert tree(path)["model.safetensors"] == WEIGHTS
    fetcher, _ = make(hub, weights_dir, free=lambda directory: 450_000)
    error = await failure_of(fetcher.fetch(SOURCE, files=["*.safetensors"]))
    assert "has 450,000 bytes free; hf://acme/tiny-llama needs 1 MB more" in str(error)


@pytest_twisted.ensureDeferred
async def test_a_file_that_grows_past_its_listed_size_is_stopped_as_it_grows(http, weights_dir):
    # No Content-Length: the listing's size is all there is to hold it to.
    http.files[LISTING] = Served(listing_of(one("a.bin", 100)))
    http.files[f"/acme/evil/resolve/{COMMIT}/a.bin"] = Served(model_bytes(1_000_000), length=False, delay=0.01,
                                                             chunk=1024)
    fetcher = Fetcher(reactor, weights_dir, environ={"HF_ENDPOINT": http.base})
    error = await failure_of(fetcher.fetch("hf://acme/evil"))
    assert isinstance(error, SizeMismatch) and "over the limit of 100" in str(error), str(error)
    assert http.seen[-1].sent < 100_000
    assert not (weights_dir / cache_name("hf://acme/evil")).exists()


def test_a_refusal_never_reads_as_enough(tmp_path):
    room = Room("node05", free=lambda directory: 73_040_000_000)
    with pytest.raises(FetchError) as caught:
        room.take("a", tmp_path, 73_060_000_000, "hf://acme/big")
    assert f"{tmp_path} has 73,040,000,000 bytes free; hf://acme/big needs 73,060,000,000 bytes more" in str(
        caught.value)
    room.take("b", tmp_path, 2_000_000_000, "hf://acme/small")
    with pytest.raises(FetchError, match="has 73 GB free, 2 GB of it for downloads under way; hf://acme/big "
                                         "needs 72 GB more"):
        room.take("c", tmp_path, 72_000_000_000, "hf://acme/big")


@pytest_twisted.ensureDeferred
async def test_a_file_of_no_stated_length_is_stopped_at_what_was_free_not_when_the_disk_is_full(http, weights_dir):
    # No listing, no Content-Length, no size in the catalog: nothing to refuse it
    # by ahead.  It may write what was free where it lands when it began, less
    # what the others under way still need, and is stopped there rather than
    # fill the filesystem every other download and engine log share.
    http.files["/endless.gguf"] = Served(model_bytes(200_000), length=False, chunk=1024, delay=0.01)
    fetcher = Fetcher(reactor, weights_dir, node_id="node05", free=lambda directory: 150_000)
    error = await failure_of(fetcher.fetch(http.url("/endless.gguf")))
    assert isinstance(error, SizeMismatch)
    assert str(error).startswith(f"node05: {http.url('/endless.gguf')} is 15") and \
        f"over the 150000 bytes {weights_dir} had free when it began, stating no length" in str(error), str(error)
    assert http.seen[0].sent < 200_000
    assert os.listdir(weights_dir) == []  # nothing kept of what could never fit
