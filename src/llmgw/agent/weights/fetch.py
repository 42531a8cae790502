"""Fetching a model's weights onto this node: once per source, resumable, verified.

``Fetcher.fetch(source)`` returns a Deferred that fires with the path the
engine should open.  For a local path that is the path itself, checked but
never copied.  For a URL it is ``<weights_dir>/<cache name>``, which exists
only once a download is complete and verified: the bytes go to
``<cache name>.partial`` first, and are renamed only when the size matches
what the server said and the sha256 matches what the catalog said.

A repository (``hf://ORG/REPO[@REV]``) or a split GGUF is fetched the same
way file by file into one directory, renamed into place whole: see
:mod:`.snapshot`.

One download per source, however many shards ask: the second caller waits on
the first one's download.  A download that is cut off keeps its ``.partial``,
and the next fetch continues it with a Range request; a ``.partial`` whose
sha256 turns out wrong is deleted, because resuming a corrupt prefix would
only fail again, slower.  A ``.partial`` is locked (``flock``) while it is
written, so two agents sharing one weights directory on a filer do not write
into the same file; the second waits for the first.
"""

from __future__ import annotations

import hashlib
import os
import re
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable, Mapping

from twisted.internet import defer, task, threads
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.client import Agent, BrowserLikePolicyForHTTPS, BrowserLikeRedirectAgent
from twisted.web.http_headers import Headers
from twisted.web.iweb import UNKNOWN_LENGTH

from llmgw.webclient import connection_pool
from llmgw.weightnames import HF_ENDPOINT, WeightsSource, cache_name, parse, partial_name, patterns_key

from .body import Writer, describe, discard
from .errors import ChecksumMismatch, FetchError, SizeMismatch
from .pace import Pace
from .partial import check_local, finished, lock_partial, release_partial
from .records import Progress
from .refusals import header, linked_sha256, refused
from .room import Room, free_bytes
from .sources import request_headers

log = Logger()

_CONTENT_RANGE = re.compile(r"bytes\s+(?:(\d+)-(\d+)|\*)/(\d+|\*)", re.IGNORECASE)
_HASH_BLOCK = 4 << 20
_SHA256 = re.compile(r"[0-9a-fA-F]{64}")


class Fetcher:
    """Fetches sources into *weights_dir*; pass ``clock=reactor`` unless you are testing.

    *progress* is called with a :class:`Progress` about once every
    ``progress_interval_s`` of *clock* while a download runs, and once more
    when it ends.  *environ* supplies ``HF_TOKEN`` and ``HF_ENDPOINT``
    (a mirror of huggingface.co); it defaults to the process environment.
    *max_bytes* refuses a file larger than that, whether the server says so
    up front or keeps sending (a repository: all its files together);
    *check* names what to check when the server has no such file (the
    engine installer fetches release archives too).  *max_listing_bytes*
    and *max_files* bound what llmgw reads of a repository's listing.
    A download whose size is known is refused when it does not fit in the
    free space (*free*, statvfs unless testing) beside the downloads under
    way (``room``); *node_id* begins those refusals.  *pace* (agent.yaml's
    ``weights:`` or ``installs:``, named *pace_where* in what a give-up
    says) holds every fetch to a minimum rate and a deadline: :mod:`.pace`.
    """

    def __init__(self, reactor, weights_dir: str | os.PathLike, clock=None,
                 progress: Callable[[Progress], Any] | None = None, *,
                 environ: Mapping[str, str] | None = None, hf_endpoint: str | None = None,
                 connect_timeout_s: float = 30.0, idle_timeout_s: float = 60.0,
                 progress_interval_s: float = 1.0, lock_poll_s: float = 5.0,
                 tls_policy=None, redirect_limit: int = 10, max_bytes: int | None = None,
                 check: str = "the model's source", max_listing_bytes: int = 16 << 20,
                 max_files: int = 10_000, node_id: str | None = None, free=free_bytes,
                 pace=None, pace_where: str = "agent.yaml's weights"):
        self._reactor = reactor
        self._clock = clock if clock is not None else reactor
        self.weights_dir = Path(weights_dir)
        self._progress = progress
        self._environ = os.environ if environ is None else environ
        self._hf_endpoint = hf_endpoint or self._environ.get("HF_ENDPOINT") or HF_ENDPOINT
        self._idle_timeout_s = idle_timeout_s
        self._interval_s = progress_interval_s
        self._lock_poll_s = lock_poll_s
        self._max_bytes = max_bytes
        self._check = check
        self.max_listing_bytes = max_listing_bytes
        self.max_files = max_files
        self.room = Room(node_id, free)
        self._pace, self._pace_where = pace, pace_where
        pool = connection_pool(reactor, persistent=False)
        agent = Agent(reactor, contextFactory=tls_policy or BrowserLikePolicyForHTTPS(),
                      connectTimeout=connect_timeout_s, pool=pool)
        # Hugging Face answers with a redirect to its CDN on another host; the
        # redirect agent drops Authorization when the host changes.
        self._agent = BrowserLikeRedirectAgent(agent, redirectLimit=redirect_limit)
        # (source, its files: patterns) -> the callers waiting on its one fetch
        self._flights: dict[tuple[str, str], list[defer.Deferred]] = {}
        self._running: dict[tuple[str, str], defer.Deferred] = {}  # the same keys -> the fetch itself
        self._paces: dict[tuple[str, str], Pace] = {}  # the same keys -> the fetch's pace, when limited
        self._why: dict[str, str] = {}  # source -> why it is being given up, while it is

    def in_flight(self) -> frozenset[str]:
        """The sources being fetched now."""
        return frozenset(source for source, _ in self._flights)

    def fetch(self, source: str, sha256: str | None = None, expected_size: int | None = None,
              files: tuple[str, ...] | list[str] = ()) -> defer.Deferred:
        """A Deferred firing with the local path of *source*'s weights, or failing with a FetchError.

        While a fetch of *source* runs, further calls wait for it and its
        checks (the first caller's *sha256* and *expected_size*) apply to all.
        Cancelling one caller's Deferred stops that caller waiting; when no
        caller waits any more the download is given up, its ``.partial``
        kept for the next fetch.  *files* are a repository's ``files:``
        patterns (none: every file); a fetch with other patterns is another.
        """
        try:
            parsed = parse(source, hf_endpoint=self._hf_endpoint)
        except ValueError as e:
            return defer.fail(FetchError(str(e)))
        if sha256 is not None and not _SHA256.fullmatch(sha256):
            return defer.fail(FetchError(f"sha256 {sha256!r} for {source} is not 64 hex digits"))
        if parsed.directory and (sha256 is not None or expected_size is not None):
            return defer.fail(FetchError(
                f"{source} is {'a repository' if parsed.layout == 'repository' else 'a split GGUF'}: "
                "its files are checked against the hub's listing; remove the model's sha256"))
        if files and parsed.layout != "repository":
            return defer.fail(FetchError(f"{source} is not a repository (hf://ORG/REPO): files: patterns "
                                         "choose files of a repository only; remove them"))
        key = (source, patterns_key(files))
        waiters = self._flights.get(key)
        fresh = waiters is None
        if fresh:
            waiters = self._flights[key] = []
        waiter: defer.Deferred = defer.Deferred(lambda d: self._left(key, d))
        waiters.append(waiter)
        if fresh:
            pace = None
            if self._pace is not None and parsed.path is None:
                what = source if parsed.directory else parsed.url
                pace = self._paces[key] = Pace(self._clock, what, self._pace, self._pace_where,
                                               lambda reason: self._give_up(key, reason))
            if parsed.directory:
                from .snapshot import Snapshot

                flight = defer.Deferred.fromCoroutine(Snapshot(self, parsed, tuple(files), pace).run())
            else:
                flight = defer.Deferred.fromCoroutine(
                    self._fetch(parsed, sha256 and sha256.lower(), expected_size, pace))
            self._running[key] = flight
            flight.addBoth(self._landed, key, flight)
        return waiter

    def abort(self, source: str, reason: str) -> bool:
        """Stop every fetch of *source* now; its callers fail with FetchError(*reason*).

        What was written stays in its ``.partial``, for a later fetch to
        resume.  False when nothing of *source* was being fetched.
        """
        keys = [key for key in self._flights if key[0] == source]
        for key in keys:
            self._give_up(key, reason)
        return bool(keys)

    def _left(self, key: tuple[str, str], waiter: defer.Deferred) -> None:
        """*waiter* was cancelled: it waits no more, and a download nobody waits for is given up."""
        waiters = self._flights.get(key)
        if waiters is None or waiter not in waiters:
            return
        waiters.remove(waiter)
        if not waiters:
            self._give_up(key, f"{key[0]}: nothing on this node wants it any more")

    def _give_up(self, key: tuple[str, str], reason: str) -> None:
        waiters = self._flights.pop(key, None)
        if waiters is None:
            return
        log.warn("gave up fetching {source}: {reason}", source=key[0], reason=reason)
        pace = self._paces.pop(key, None)
        if pace is not None:
            pace.stop()
        flight = self._running.pop(key, None)
        if flight is not None:
            self._why[key[0]] = reason
            try:
                flight.cancel()
            finally:
                del self._why[key[0]]
        for waiter in waiters:
            waiter.errback(FetchError(reason))

    def error_text(self, source: str, e: BaseException) -> str:
        """What a fetch of *source* ending in *e* says in its last progress report: why, if it was given up."""
        if isinstance(e, defer.CancelledError) and source in self._why:
            return self._why[source]
        return str(e) or type(e).__name__

    async def get(self, src: WeightsSource, url: str, offset: int = 0):
        """The response to a GET of *url* for *src* (from byte *offset*), or FetchError when none came."""
        headers = Headers({b"User-Agent": [b"llmgw-agent"], b"Accept-Encoding": [b"identity"]})
        if offset:
            headers.setRawHeaders(b"Range", [f"bytes={offset}-".encode("ascii")])
        for name, value in request_headers(src, self._environ).items():
            headers.setRawHeaders(name.encode("ascii"), [value.encode("latin-1")])
        request = self._agent.request(b"GET", url.encode("ascii"), headers)
        request.addTimeout(self._idle_timeout_s, self._clock)
        try:
            return await request
        except Exception as e:
            # Only the timeout cancels a request; the agent reports that wrapped
            # (ResponseNeverReceived of a CancelledError) or plain.
            if isinstance(e, defer.TimeoutError) or _cancelled(e):
                raise FetchError(f"{url}: no answer within {self._idle_timeout_s:g} s") from None
            raise FetchError(f"{url}: {describe(e)}") from None

    def _landed(self, result, key: tuple[str, str], flight: defer.Deferred) -> None:
        if self._running.get(key) is not flight:
            return None  # aborted: its callers were told why
        del self._running[key]
        pace = self._paces.pop(key, None)
        if pace is not None:
            pace.stop()
        for waiter in self._flights.pop(key, []):
            if isinstance(result, Failure):
                waiter.errback(result)
            else:
                waiter.callback(result)

    async def _fetch(self, src: WeightsSource, sha256: str | None, expected_size: int | None, pace=None) -> Path:
        if src.path is not None:
            return check_local(Path(src.path))
        try:
            self.weights_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise FetchError(f"cannot create the weights directory {self.weights_dir}: {e.strerror}; "
                             "create it and give it to the agent's user") from None
        final = self.weights_dir / cache_name(src.text)
        partial = self.weights_dir / partial_name(src.text)
        while True:
            if finished(final, expected_size):
                return final
            locked = lock_partial(partial)
            if locked is None:
                log.info("{partial} is being written by another process; waiting", partial=partial)
                await task.deferLater(self._clock, self._lock_poll_s, lambda: None)
                continue
            try:
                if finished(final, expected_size):
                    return final
                return await _Download(self, src, locked, partial, final, sha256, expected_size, pace=pace).run()
            finally:
                release_partial(locked, partial)


def _cancelled(e: BaseException) -> bool:
    if isinstance(e, defer.CancelledError):
        return True
    return any(_cancelled(r.value) for r in getattr(e, "reasons", None) or ())


class _Download:
    """One download of one source into its locked partial file, up to the rename.

    *report*, when given, receives each progress report's figures instead of
    the fetcher's callback (a repository reports bytes of the whole); *pace*
    is the whole fetch's, fed while this body is read.
    """

    def __init__(self, fetcher: Fetcher, src: WeightsSource, file, partial: Path, final: Path,
                 sha256: str | None, expected_size: int | None, report=None, pace: Pace | None = None):
        self.f, self.src, self.file, self.partial, self.final = fetcher, src, file, partial, final
        self.pace = pace
        self.sha256, self.expected_size = sha256, expected_size
        self.clock, self.idle_timeout_s = fetcher._clock, fetcher._idle_timeout_s
        # A file of a listing is the size the listing says: more is an error.
        self.max_bytes = fetcher._max_bytes if expected_size is None else expected_size
        self.report_to = report
        # A repository's files were given room together, before the first of them (snapshot).
        self.room, self.free_cap = report is None, None
        # Who gave the sha256, and what to do when the bytes are not those.
        self.said_by, self.advice = "the catalog", "Check the model's source and sha256 in server.yaml"
        if report is not None:
            self.said_by, self.advice = "the hub's listing", "The next fetch downloads it again"
        self.total: int | None = None
        self.done = 0  # bytes in the partial file
        self.received = 0  # bytes received in this download
        self.started = self.clock.seconds()
        self.last = (self.started, 0)

    async def run(self) -> Path:
        ticker = task.LoopingCall(self._tick)
        ticker.clock = self.clock
        self.writer: Writer | None = None
        try:
            ticker.start(self.f._interval_s, now=False)
            path = await self._run()
        except BaseException as e:
            self._report(final=True, error=self.f.error_text(self.src.text, e))
            raise
        finally:
            self.f.room.give_back(self)
            if ticker.running:
                ticker.stop()
        self._report(final=True)
        return path

    async def _run(self) -> Path:
        offset = os.fstat(self.file.fileno()).st_size
        if offset and self.expected_size is not None and offset > self.expected_size:
            offset = self._restart()
        for _ in range(2):
            self.done = offset
            hasher = await self._hash_prefix(offset)
            response = await self._request(offset)
            if response.code == 416 and offset:
                total = self._content_range(response)[2]
                await discard(response, self.clock, self.idle_timeout_s)
                if total == offset:  # the partial is already the whole file
                    self.total = self.done = offset
                    return await self._finish(hasher)
                offset = self._restart()
                continue
            if response.code == 206:
                start, _, total = self._content_range(response)
                if start != offset:
                    await discard(response, self.clock, self.idle_timeout_s)
                    offset = self._restart()
                    continue
                self.total = total
            elif response.code == 200:
                if offset:
                    log.info("{url} ignored the Range request; downloading {name} from the start",
                             url=self.src.url, name=self.src.file_name)
                    offset = self._restart()
                    hasher = hashlib.sha256() if self.sha256 else None
                self.total = None if response.length is UNKNOWN_LENGTH else response.length
            else:
                raise await refused(self.f, self.src, response)
            hasher = await self._linked(response, offset, hasher)
            if self.total is not None and self.expected_size is not None and self.total != self.expected_size:
                await discard(response, self.clock, self.idle_timeout_s)
                raise SizeMismatch(f"{self.src.url} is {self.total} bytes, expected {self.expected_size}; "
                                   f"check {self.f._check}")
            if self.total is not None and self.max_bytes is not None and self.total > self.max_bytes:
                await discard(response, self.clock, self.idle_timeout_s)
                raise self.too_large(self.total)
            size = self.total if self.total is not None else self.expected_size
            if self.room and size is not None:
                try:
                    self.f.room.take(self, self.partial.parent, size - offset, self.src.text,
                                     lambda: size - self.done)
                except FetchError:
                    await discard(response, self.clock, self.idle_timeout_s)
                    raise
            elif self.room:  # nobody said how big: it may write what is free there now, and no more
                self.free_cap = offset + self.f.room.ceiling(self.partial.parent)
                self.max_bytes = self.free_cap if self.max_bytes is None else min(self.max_bytes, self.free_cap)
            self.done = offset
            if offset:
                log.info("resuming {name} at byte {offset}", name=self.src.file_name, offset=offset)
            self.file.seek(offset)
            self.writer = Writer(self, hasher)
            response.deliverBody(self.writer)
            with self.pace.reading() if self.pace is not None else nullcontext():
                await self.writer.finished
            return await self._finish(hasher)
        raise FetchError(f"{self.src.url} answers Range requests inconsistently; "
                         f"remove {self.partial} and try again")

    async def _linked(self, response, offset: int, hasher):
        """The hasher, now also for the sha256 the hub sends with an LFS file (``X-Linked-Etag``).

        Hugging Face publishes an LFS file's sha256 with its download (on the
        redirect to its CDN), so an hf:// file is verified even when nobody
        gave a sha256; one that contradicts the sha256 given is refused before
        its bytes are read.
        """
        linked = linked_sha256(response) if self.src.kind == "hf" else None
        if linked is None:
            return hasher
        if self.sha256 is None:
            self.sha256, self.said_by = linked, "the hub (X-Linked-Etag)"
            self.advice = "The next fetch downloads it again; if it fails again, the hub or a proxy is at fault"
            return await self._hash_prefix(offset)
        if linked != self.sha256:
            await discard(response, self.clock, self.idle_timeout_s)
            self.partial.unlink(missing_ok=True)
            raise ChecksumMismatch(f"{self.src.file_name} from {self.src.url}: the hub says its sha256 is {linked}, "
                                   f"{self.said_by} says {self.sha256}; nothing was kept. {self.advice}")
        return hasher

    def _restart(self) -> int:
        self.file.seek(0)
        self.file.truncate(0)
        return 0

    async def _hash_prefix(self, offset: int):
        if not self.sha256:
            return None
        hasher = hashlib.sha256()
        if offset:
            fd = self.file.fileno()

            def read():
                pos = 0
                while pos < offset:
                    block = os.pread(fd, min(_HASH_BLOCK, offset - pos), pos)
                    if not block:
                        break
                    hasher.update(block)
                    pos += len(block)

            await self._in_thread(read)
        return hasher

    def _in_thread(self, fn) -> defer.Deferred:
        reactor = self.f._reactor
        return threads.deferToThreadPool(reactor, reactor.getThreadPool(), fn)

    async def _request(self, offset: int):
        return await self.f.get(self.src, self.src.url, offset)

    def _content_range(self, response) -> tuple[int | None, int | None, int | None]:
        text = header(response, b"Content-Range") or ""
        match = _CONTENT_RANGE.fullmatch(text.strip())
        if not match:
            return (None, None, None)
        start, end, total = match.groups()
        return (int(start) if start else None, int(end) if end else None,
                int(total) if total and total != "*" else None)

    async def _finish(self, hasher) -> Path:
        self.file.flush()
        size = os.fstat(self.file.fileno()).st_size
        if self.total is not None and size != self.total:
            raise SizeMismatch(f"{self.src.url}: got {size} of {self.total} bytes; the next fetch resumes from there")
        if self.expected_size is not None and size != self.expected_size:
            raise SizeMismatch(f"{self.src.url}: got {size} bytes, expected {self.expected_size}")
        if size == 0:
            raise FetchError(f"{self.src.url} sent an empty file; check {self.f._check}")
        if hasher is not None and hasher.hexdigest() != self.sha256:
            self.partial.unlink(missing_ok=True)
            raise ChecksumMismatch(
                f"{self.src.file_name} from {self.src.url} has sha256 {hasher.hexdigest()}, {self.said_by} says "
                f"{self.sha256}; the download was deleted. {self.advice}")
        await self._in_thread(lambda: os.fsync(self.file.fileno()))
        os.replace(self.partial, self.final)
        log.info("fetched {name} into {final} ({size} bytes)", name=self.src.file_name, final=self.final, size=size)
        return self.final

    def too_large(self, size: int) -> SizeMismatch:
        self.partial.unlink(missing_ok=True)
        limit = f"the limit of {self.max_bytes}" if self.max_bytes != self.free_cap else \
            f"the {self.max_bytes} bytes {self.partial.parent} had free when it began, stating no length"
        return SizeMismatch(f"{self.f.room.node}{self.src.url} is {size} bytes or more, over {limit}; "
                            f"check {self.f._check}")

    def _tick(self) -> None:
        writer = self.writer
        if writer is not None and not writer.finished.called:
            if self.clock.seconds() - writer.last_data >= self.idle_timeout_s:
                writer.stalled()
                return
            where = f"byte {self.done}" + (f" of {self.src.file_name}" if self.report_to is not None else "")
            if self.pace is not None and not self.pace.look(self.src.url, where):
                return  # given up: the download has ended, and said so
        self._report()

    def _report(self, *, final: bool = False, error: str | None = None) -> None:
        now = self.clock.seconds()
        if final:
            elapsed, moved = now - self.started, self.received
        else:
            elapsed, moved = now - self.last[0], self.received - self.last[1]
            self.last = (now, self.received)
        rate = moved / elapsed if elapsed > 0 else None
        if self.report_to is not None:
            self.report_to(self, rate, final, error)
            return
        if self.f._progress is None:
            return
        report = Progress(source=self.src.text, file_name=self.src.file_name, bytes_done=self.done,
                          bytes_total=self.total, rate_bps=rate, final=final, error=error)
        try:
            self.f._progress(report)
        except Exception:
            log.failure("progress callback failed for {source}", source=self.src.text)
