"""Response bodies: one streamed into the partial file, others read a little and dropped."""

from __future__ import annotations

from twisted.internet import defer, protocol
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone
from twisted.web.http import PotentialDataLoss

from .errors import FetchError


class Writer(protocol.Protocol):
    """Streams a response body into the partial file, hashing as it goes."""

    def __init__(self, download, hasher):
        self.d, self.hasher = download, hasher
        self.finished: defer.Deferred = defer.Deferred(self._abandoned)
        self.last_data = download.clock.seconds()
        self.error: FetchError | None = None

    def _abandoned(self, _) -> None:
        # Cancelled (Fetcher.abort): read no more; the file it wrote to is closed.
        self.error = FetchError(f"{self.d.src.url}: the download was given up")
        if self.transport is not None:
            self.transport.stopProducing()

    def dataReceived(self, data: bytes) -> None:
        if self.error is not None:
            return
        try:
            self.d.file.write(data)
        except OSError as e:
            self.error = FetchError(f"cannot write {self.d.partial}: {e.strerror}; "
                                    "the next fetch resumes from what was written")
            self.transport.stopProducing()
            return
        if self.hasher is not None:
            self.hasher.update(data)
        self.d.done += len(data)
        self.d.received += len(data)
        if self.d.pace is not None:
            self.d.pace.moved += len(data)
        self.last_data = self.d.clock.seconds()
        if self.d.max_bytes is not None and self.d.done > self.d.max_bytes:
            # A server that sent no length, or more than it said.
            self.error = self.d.too_large(self.d.done)
            self.transport.stopProducing()

    def stalled(self) -> None:
        self.error = FetchError(
            f"{self.d.src.url}: nothing received for {self.d.idle_timeout_s:g} s after "
            f"{self.d.done} bytes; the next fetch resumes from there")
        self.transport.stopProducing()

    def connectionLost(self, reason: Failure = protocol.connectionDone) -> None:
        if self.finished.called:
            return
        if self.error is not None:
            self.finished.errback(self.error)
        elif reason.check(ResponseDone) or (reason.check(PotentialDataLoss) and self.d.total is None):
            # PotentialDataLoss: a body without a length ends when the server
            # closes; that is its end, and a sha256 catches a cut.
            self.finished.callback(None)
        else:
            of = f" of {self.d.total}" if self.d.total is not None else ""
            self.finished.errback(FetchError(
                f"{self.d.src.url}: connection lost after {self.d.done}{of} bytes ({describe(reason.value)}); "
                "the next fetch resumes from there"))


class _Keep(protocol.Protocol):
    """Keeps the first *keep* bytes of a body (an error page's message) and hangs up."""

    def __init__(self, keep: int):
        self.keep, self.body = keep, b""
        self.done: defer.Deferred = defer.Deferred()

    def dataReceived(self, data: bytes) -> None:
        if len(self.body) < self.keep:
            self.body += data[: self.keep - len(self.body)]
        if len(self.body) >= self.keep:
            self.transport.stopProducing()

    def connectionLost(self, reason=protocol.connectionDone) -> None:
        if not self.done.called:
            self.done.callback(self.body)


async def read_json_body(response, clock, timeout_s: float, limit: int, what: str) -> bytes:
    """A whole body of at most *limit* bytes (a listing), or FetchError naming *what* when longer or late."""
    reader = _Keep(limit + 1)
    response.deliverBody(reader)
    reader.done.addTimeout(timeout_s, clock)
    try:
        body = await reader.done
    except defer.TimeoutError:
        raise FetchError(f"{what}: not all of it came within {timeout_s:g} s") from None
    if len(body) > limit:
        raise FetchError(f"{what} is over {limit} bytes, the most llmgw reads of a listing")
    return body


async def discard(response, clock, timeout_s: float, keep: int = 0) -> bytes:
    """Read (at most *keep* bytes of) a body we do not want, so its connection closes."""
    reader = _Keep(keep)
    response.deliverBody(reader)
    if keep == 0:
        reader.transport.stopProducing()
    reader.done.addTimeout(timeout_s, clock)
    try:
        return await reader.done
    except defer.TimeoutError:
        return reader.body


def describe(e: BaseException) -> str:
    """An exception from the HTTP client in words, unwrapping the failures Twisted nests."""
    reasons = getattr(e, "reasons", None)
    if reasons:  # ResponseFailed and friends wrap a list of failures
        return "; ".join(describe(r.value) for r in reasons)
    text = str(e).strip()
    return text or type(e).__name__
