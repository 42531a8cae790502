"""Fetching weights from a real HTTP server on 127.0.0.1: what a node operator would see.

Time that matters (progress, stalls, waiting on a lock) follows an injected
``Clock`` the test advances; bytes move over a real socket.
"""

from __future__ import annotations

import fcntl
import os

import pytest
import pytest_twisted
from twisted.internet import defer, reactor, ssl, task
from twisted.web.client import BrowserLikePolicyForHTTPS

from llmgw.agent.weights import (
    ChecksumMismatch,
    FetchError,
    Fetcher,
    SizeMismatch,
    cache_name,
    partial_name,
)
from tests.support.wait import sleep, until

from .modelserver import ModelServer, Served, listing, model_bytes, sha

MODEL = "/models/gemma-3-270m-q4_k_m.gguf"


def make(weights_dir, clock=None, **kw):
    reports = []
    kw.setdefault("environ", {})
    return Fetcher(reactor, weights_dir, clock=clock, progress=reports.append, **kw), reports


async def failure_of(d: defer.Deferred) -> Exception:
    try:
        await d
    except Exception as e:
        return e
    raise AssertionError("the fetch succeeded")


@pytest_twisted.ensureDeferred
async def test_a_file_with_a_length_lands_under_its_cache_name_verified(http, weights_dir):
    data = model_bytes(300_000)
    http.files[MODEL] = Served(data)
    source = http.url(MODEL)
    fetcher, reports = make(weights_dir)
    path = await fetcher.fetch(source, sha256=sha(data))
    assert path == weights_dir / cache_name(source)
    assert path.read_bytes() == data
    assert listing(weights_dir) == [cache_name(source)]  # no .partial left behind
    final = reports[-1]
    assert final.final and final.error is None
    assert (final.bytes_done, final.bytes_total) == (len(data), len(data))
    assert final.file_name == "gemma-3-270m-q4_k_m.gguf" and final.source == source
    # Fetched already: no second download.
    assert await fetcher.fetch(source, sha256=sha(data)) == path
    assert len(http.requests_for(MODEL)) == 1


@pytest_twisted.ensureDeferred
async def test_a_file_without_a_length_reports_no_total(http, weights_dir):
    data = model_bytes(200_000)
    http.files[MODEL] = Served(data, length=False)
    fetcher, reports = make(weights_dir)
    path = await fetcher.fetch(http.url(MODEL))
    assert path.read_bytes() == data
    assert "content-length" not in http.requests_for(MODEL)[0].headers
    assert reports and all(r.bytes_total is None for r in reports)
    assert reports[-1].bytes_done == len(data)


@pytest.mark.parametrize("length", [True, False], ids=["content-length", "chunked"])
@pytest_twisted.ensureDeferred
async def test_a_slow_download_reports_progress_once_a_second_not_once_a_chunk(http, weights_dir, length):
    data = model_bytes(40 * 4096)
    http.files[MODEL] = Served(data, length=length, chunk=4096, delay=0.02)
    clock = task.Clock()
    fetcher, reports = make(weights_dir, clock)
    d = fetcher.fetch(http.url(MODEL))

    async def a_clock_second(interval):
        await sleep(interval)
        clock.advance(1.0)

    await until(lambda: d.called, "the download to finish, a clock second at a time", interval=0.08,
                pause=a_clock_second)
    await d
    seconds = clock.seconds()
    interim, final = reports[:-1], reports[-1]
    assert final.final and final.bytes_done == len(data)
    # Forty chunks, a handful of clock seconds: at most one report per second.
    assert 2 <= len(interim) <= seconds
    assert all(not r.final for r in interim)
    done = [r.bytes_done for r in interim]
    assert done == sorted(done) and done[0] < done[-1] <= len(data)
    assert all(r.bytes_total == (len(data) if length else None) for r in reports)
    assert all(r.rate_bps is not None and r.rate_bps >= 0 for r in interim)


@pytest_twisted.ensureDeferred
async def test_without_clock_ticks_there_is_only_the_final_report(http, weights_dir):
    data = model_bytes(30 * 4096)
    http.files[MODEL] = Served(data, chunk=4096, delay=0.005)
    fetcher, reports = make(weights_dir, task.Clock())
    await fetcher.fetch(http.url(MODEL))
    assert len(reports) == 1 and reports[0].final


@pytest_twisted.ensureDeferred
async def test_a_download_cut_off_midway_is_resumed_not_restarted(http, weights_dir):
    data = model_bytes(500_000)
    http.files[MODEL] = Served(data, cut_after=200_000)
    source = http.url(MODEL)
    fetcher, reports = make(weights_dir)
    error = await failure_of(fetcher.fetch(source, sha256=sha(data)))
    assert isinstance(error, FetchError)
    assert "connection lost after 200000 of 500000 bytes" in str(error) and "resumes" in str(error)
    assert reports[-1].final and reports[-1].error
    assert listing(weights_dir) == [partial_name(source)]  # nothing under the final name
    assert (weights_dir / partial_name(source)).stat().st_size == 200_000

    path = await fetcher.fetch(source, sha256=sha(data))
    assert path.read_bytes() == data
    first, second = http.requests_for(MODEL)
    assert "range" not in first.headers
    assert second.headers["range"] == "bytes=200000-"
    assert (second.status, second.sent) == (206, 300_000)  # only the rest crossed the wire
    assert listing(weights_dir) == [cache_name(source)]


@pytest_twisted.ensureDeferred
async def test_a_server_that_ignores_range_restarts_the_file_cleanly(http, weights_dir):
    data = model_bytes(300_000)
    http.files[MODEL] = Served(data, cut_after=100_000)
    source = http.url(MODEL)
    fetcher, _ = make(weights_dir)
    await failure_of(fetcher.fetch(source))
    http.files[MODEL].ranges = False
    # No sha256: the size alone must come out right, so nothing was appended to the old prefix.
    path = await fetcher.fetch(source)
    assert path.read_bytes() == data
    second = http.requests_for(MODEL)[1]
    assert second.headers["range"] == "bytes=100000-" and second.status == 200


@pytest_twisted.ensureDeferred
async def test_a_partial_that_is_already_whole_is_finished_without_a_body(http, weights_dir):
    data = model_bytes(50_000)
    http.files[MODEL] = Served(data)
    source = http.url(MODEL)
    (weights_dir / partial_name(source)).write_bytes(data)
    fetcher, _ = make(weights_dir)
    path = await fetcher.fetch(source, sha256=sha(data))
    assert path.read_bytes() == data
    (seen,) = http.requests_for(MODEL)
    assert seen.status == 416 and seen.sent == 0


@pytest_twisted.ensureDeferred
async def test_a_wrong_sha256_is_refused_and_leaves_nothing_behind(http, weights_dir):
    data = model_bytes(100_000)
    http.files[MODEL] = Served(data)
    source = http.url(MODEL)
    fetcher, reports = make(weights_dir)
    error = await failure_of(fetcher.fetch(source, sha256="0" * 64))
    assert isinstance(error, ChecksumMismatch)
    assert sha(data) in str(error) and "0" * 64 in str(error) and "deleted" in str(error)
    assert listing(weights_dir) == []  # neither the final name nor a partial to resume
    assert reports[-1].error == str(error)


@pytest_twisted.ensureDeferred
async def test_a_corrupt_partial_is_not_resumed_twice(http, weights_dir):
    data = model_bytes(100_000)
    http.files[MODEL] = Served(data)
    source = http.url(MODEL)
    (weights_dir / partial_name(source)).write_bytes(b"\xff" * 30_000)  # not the file's first bytes
    fetcher, _ = make(weights_dir)
    assert isinstance(await failure_of(fetcher.fetch(source, sha256=sha(data))), ChecksumMismatch)
    assert listing(weights_dir) == []
    path = await fetcher.fetch(source, sha256=sha(data))
    assert path.read_bytes() == data
    assert "range" not in http.requests_for(MODEL)[-1].headers


@pytest_twisted.ensureDeferred
async def test_eight_callers_at_once_make_one_download(http, weights_dir):
    data = model_bytes(64 * 4096)
    http.files[MODEL] = Served(data, chunk=4096, delay=0.005)
    source = http.url(MODEL)
    fetcher, reports = make(weights_dir)
    waiting = [fetcher.fetch(source, sha256=sha(data)) for _ in range(8)]
    assert fetcher.in_flight() == {source}
    paths = await defer.gatherResults(waiting)
    assert paths == [weights_dir / cache_name(source)] * 8
    assert len(http.requests_for(MODEL)) == 1
    assert sum(r.final for r in reports) == 1  # one download, one progress stream
    assert fetcher.in_flight() == frozenset()


@pytest_twisted.ensureDeferred
async def test_one_caller_giving_up_does_not_stop_the_others(http, weights_dir):
    data = model_bytes(32 * 4096)
    http.files[MODEL] = Served(data, chunk=4096, delay=0.005)
    fetcher, _ = make(weights_dir)
    impatient, patient = fetcher.fetch(http.url(MODEL)), fetcher.fetch(http.url(MODEL))
    impatient.cancel()
    assert isinstance(await failure_of(impatient), defer.CancelledError)
    assert (await patient).read_bytes() == data


@pytest_twisted.ensureDeferred
async def test_https_is_verified_against_the_trusted_roots(pki, weights_dir):
    data = model_bytes(50_000)
    identity = ssl.PrivateCertificate.loadPEM((pki / "llmgw-server.crt").read_bytes()
                                              + (pki / "llmgw-server.key").read_bytes())
    srv = ModelServer().start(tls=identity.options())
    try:
        srv.files[MODEL] = Served(data)
        trusted = BrowserLikePolicyForHTTPS(trustRoot=ssl.Certificate.loadPEM((pki / "ca.crt").read_bytes()))
        fetcher, _ = make(weights_dir, tls_policy=trusted)
        assert (await fetcher.fetch(srv.url(MODEL), sha256=sha(data))).read_bytes() == data
        # The same server with the system's roots only: a certificate nobody vouches for is refused.
        stranger, _ = make(weights_dir / "other")
        error = await failure_of(stranger.fetch(srv.url(MODEL)))
        assert isinstance(error, FetchError) and srv.url(MODEL) in str(error)
        assert not (weights_dir / "other" / cache_name(srv.url(MODEL))).exists()
    finally:
        await srv.stop()


@pytest_twisted.ensureDeferred
async def test_redirects_are_followed(http, weights_dir):
    data = model_bytes(20_000)
    http.files["/old/name.gguf"] = Served(redirect=http.url("/cdn/blob"))
    http.files["/cdn/blob"] = Served(data)
    fetcher, _ = make(weights_dir)
    path = await fetcher.fetch(http.url("/old/name.gguf"), sha256=sha(data))
    assert path.read_bytes() == data
    assert path.name.endswith("-name.gguf")


@pytest_twisted.ensureDeferred
async def test_hf_sources_go_to_the_resolve_url_with_the_token(http, weights_dir):
    data = model_bytes(10_000)
    http.files["/unsloth/gemma-3-270m-it-GGUF/resolve/main/gemma-3-270m-it-Q4_K_M.gguf"] = Served(data)
    http.files["/org/repo/resolve/v1.2/q4/model.gguf"] = Served(data)
    fetcher, _ = make(weights_dir, environ={"HF_TOKEN": "hf_secret", "HF_ENDPOINT": http.base})
    await fetcher.fetch("hf://unsloth/gemma-3-270m-it-GGUF/gemma-3-270m-it-Q4_K_M.gguf")
    await fetcher.fetch("hf://org/repo@v1.2/q4/model.gguf")
    assert [s.headers.get("authorization") for s in http.seen] == ["Bearer hf_secret"] * 2
    assert [s.status for s in http.seen] == [200, 200]


@pytest_twisted.ensureDeferred
async def test_the_token_goes_to_hugging_face_only(http, other_http, weights_dir):
    data = model_bytes(10_000)
    # Hugging Face redirects to a CDN on another host, which must not see the token.
    http.files["/org/repo/resolve/main/m.gguf"] = Served(redirect=other_http.url("/blob/m"))
    other_http.files["/blob/m"] = Served(data)
    http.files["/plain/m.gguf"] = Served(data)
    fetcher, _ = make(weights_dir, environ={"HF_TOKEN": "hf_secret"}, hf_endpoint=http.base)
    await fetcher.fetch("hf://org/repo/m.gguf")
    await fetcher.fetch(http.url("/plain/m.gguf"))
    assert http.requests_for("/org/repo/resolve/main/m.gguf")[0].headers["authorization"] == "Bearer hf_secret"
    assert "authorization" not in other_http.requests_for("/blob/m")[0].headers
    assert "authorization" not in http.requests_for("/plain/m.gguf")[0].headers  # an https:// source is anybody's


@pytest_twisted.ensureDeferred
async def test_a_gated_repository_without_a_token_says_to_set_hf_token(http, weights_dir):
    http.files["/org/gated/resolve/main/m.gguf"] = Served(status=401, body=b"Access to model org/gated is restricted\n")
    fetcher, _ = make(weights_dir, hf_endpoint=http.base)
    error = await failure_of(fetcher.fetch("hf://org/gated/m.gguf"))
    assert "HTTP 401" in str(error) and "is restricted" in str(error) and "set HF_TOKEN" in str(error)
    assert "authorization" not in http.seen[0].headers


@pytest_twisted.ensureDeferred
async def test_a_missing_file_names_the_url_and_leaves_nothing_under_the_final_name(http, weights_dir):
    fetcher, _ = make(weights_dir)
    source = http.url("/nope.gguf")
    error = await failure_of(fetcher.fetch(source))
    assert isinstance(error, FetchError)
    assert source in str(error) and "404" in str(error) and "check the model's source" in str(error)
    assert not (weights_dir / cache_name(source)).exists()


@pytest.mark.parametrize("length", [True, False], ids=["content-length", "chunked"])
@pytest_twisted.ensureDeferred
async def test_a_file_over_max_bytes_is_refused_and_nothing_is_kept(http, weights_dir, length):
    http.files[MODEL] = Served(model_bytes(300_000), length=length)
    source = http.url(MODEL)
    fetcher, reports = make(weights_dir, max_bytes=100_000, check="the mirror")
    error = await failure_of(fetcher.fetch(source))
    assert isinstance(error, SizeMismatch)
    assert source in str(error) and "over the limit of 100000" in str(error) and "check the mirror" in str(error)
    assert listing(weights_dir) == []
    assert reports[-1].final and reports[-1].error == str(error)


@pytest_twisted.ensureDeferred
async def test_a_stalled_server_fails_the_fetch_instead_of_hanging(http, weights_dir):
    data = model_bytes(100_000)
    http.files[MODEL] = Served(data, stall_after=30_000)
    source = http.url(MODEL)
    clock = task.Clock()
    fetcher, reports = make(weights_dir, clock, idle_timeout_s=5.0)
    d = fetcher.fetch(source)
    await until(lambda: http.seen and http.seen[0].sent == 30_000, "the server sent its first bytes")
    await until(lambda: (weights_dir / partial_name(source)).stat().st_size == 30_000, "they were written")
    for _ in range(6):
        clock.advance(1.0)
    error = await failure_of(d)
    assert "nothing received for 5 s after 30000 bytes" in str(error)
    assert (weights_dir / partial_name(source)).stat().st_size == 30_000  # kept, to resume


@pytest_twisted.ensureDeferred
async def test_a_server_that_never_answers_fails_the_fetch(http, weights_dir):
    http.files[MODEL] = Served(hang=True)
    clock = task.Clock()
    fetcher, _ = make(weights_dir, clock, idle_timeout_s=5.0)
    d = fetcher.fetch(http.url(MODEL))
    await until(lambda: http.seen, "the request arrived")
    clock.advance(5.0)
    error = await failure_of(d)
    assert isinstance(error, FetchError) and "no answer within 5 s" in str(error)
    assert listing(weights_dir) == []  # nothing arrived, nothing to resume, nothing left


@pytest_twisted.ensureDeferred
async def test_a_size_other_than_expected_is_refused_before_downloading(http, weights_dir):
    http.files[MODEL] = Served(model_bytes(10_000))
    fetcher, _ = make(weights_dir)
    error = await failure_of(fetcher.fetch(http.url(MODEL), expected_size=9_999))
    assert isinstance(error, SizeMismatch) and "10000 bytes, expected 9999" in str(error)
    assert not (weights_dir / cache_name(http.url(MODEL))).exists()


@pytest_twisted.ensureDeferred
async def test_another_process_writing_the_partial_is_waited_for(http, weights_dir):
    data = model_bytes(10_000)
    http.files[MODEL] = Served(data)
    source = http.url(MODEL)
    clock = task.Clock()
    fetcher, _ = make(weights_dir, clock, lock_poll_s=5.0)
    holder = os.open(weights_dir / partial_name(source), os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)
    d = fetcher.fetch(source)
    # Its next look at the lock is on the test's clock: until that moves, it waits.
    await until(lambda: clock.getDelayedCalls(), "the fetch to wait for the other process's lock")
    assert not d.called and http.seen == []  # one download at a time, even across agents
    # The other agent finishes: renames its partial and lets go.
    with open(weights_dir / partial_name(source), "wb") as f:
        f.write(data)
    os.rename(weights_dir / partial_name(source), weights_dir / cache_name(source))
    os.close(holder)
    clock.advance(5.0)
    assert (await d).read_bytes() == data
    assert http.seen == []


@pytest_twisted.ensureDeferred
async def test_a_local_path_is_used_where_it_is(tmp_path, weights_dir):
    model = tmp_path / "operator" / "model.gguf"
    model.parent.mkdir()
    model.write_bytes(b"GGUF" + b"\0" * 100)
    folder = tmp_path / "operator" / "qwen"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    fetcher, reports = make(weights_dir)
    assert await fetcher.fetch(str(model)) == model
    assert await fetcher.fetch(str(folder)) == folder  # vLLM loads a directory
    assert listing(weights_dir) == [] and reports == []


@pytest.mark.parametrize("what, expected", [
    ("missing", "does not exist on this node"),
    ("empty", "is empty (0 bytes)"),
    ("empty-dir", "is an empty directory"),
])
@pytest_twisted.ensureDeferred
async def test_a_local_path_that_is_not_weights_is_named(tmp_path, weights_dir, what, expected):
    path = tmp_path / what
    if what == "empty":
        path.write_bytes(b"")
    elif what == "empty-dir":
        path.mkdir()
    fetcher, _ = make(weights_dir)
    error = await failure_of(fetcher.fetch(str(path)))
    assert str(path) in str(error) and expected in str(error)


@pytest_twisted.ensureDeferred
async def test_a_malformed_source_is_refused_with_what_to_write(weights_dir):
    fetcher, _ = make(weights_dir)
    error = await failure_of(fetcher.fetch("models/gemma.gguf"))
    assert isinstance(error, FetchError) and "absolute path" in str(error)
    error = await failure_of(fetcher.fetch("https://mirror.lab/m.gguf", sha256="abc"))
    assert "not 64 hex digits" in str(error)
