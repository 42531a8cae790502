"""A watch on a key or a prefix over etcd's streamed ``/v3/watch``, resumed where it broke off.

The gateway answers one JSON line per batch: ``{"result": {"created": true}}``
first, then ``{"result": {"events": [...]}}``.  Each line is bounded by
``max_response_bytes`` and read as the client reads any answer.  When the
stream ends (the member stopped, the connection broke, the line was not
etcd's) the watch asks again, the next member first, from the revision after
the last it saw, so no event between is lost; when etcd has compacted that
revision away it resumes from the oldest one etcd keeps and says so in the
log.  A member that hangs keeps its stream silent: what must not wait on a
watch (the election) reads the key on its own schedule too.
"""

from __future__ import annotations

import enum
import json
from typing import Callable

import attrs
from twisted.internet import defer, task
from twisted.internet.protocol import Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone
from twisted.web.http import PotentialDataLoss

from llmgw.ha.etcd import (
    JSON_HEADERS,
    BadAnswer,
    BoundedBody,
    EtcdClient,
    KeyValue,
    BodyBytes,
    b64,
    describe,
    field_int,
    field_list,
    field_object,
    key_value,
    prefix_end,
)

log = Logger()

RETRY_FIRST_S = 0.2
RETRY_MOST_S = 5.0


class WatchKind(enum.Enum):
    PUT = "put"
    DELETE = "delete"


@attrs.frozen
class WatchEvent:
    """A key put or deleted; a deletion's ``kv`` has only the key and its ``mod_revision``."""

    kind: WatchKind
    kv: KeyValue


_KINDS = {"PUT": WatchKind.PUT, "DELETE": WatchKind.DELETE}


class _Lines(Protocol):
    """Hands each line of a streamed body to *on_line*, refusing one longer than *limit*."""

    def __init__(self, limit: int, on_line: Callable[[bytes], None]):
        self.limit, self.on_line, self.buffer = limit, on_line, b""
        self.done: defer.Deferred[None] = defer.Deferred(lambda _: self.abort())

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.stopProducing()

    def dataReceived(self, data: bytes) -> None:
        self.buffer += data
        while b"\n" in self.buffer and not self.done.called:
            line, self.buffer = self.buffer.split(b"\n", 1)
            try:
                self.on_line(line)
            except Exception as e:
                self.abort()
                self.done.errback(e)
                return
        if len(self.buffer) > self.limit and not self.done.called:
            self.abort()
            self.done.errback(BadAnswer(f"sent a line of more than {self.limit} bytes (ha.max_response_bytes)"))

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
        if not self.done.called:
            if reason is None or reason.check(ResponseDone, PotentialDataLoss):
                self.done.callback(None)
            else:
                self.done.errback(BadAnswer(f"the stream broke off: {reason.getErrorMessage()}"))


class _Compacted(Exception):
    pass


class Watch:
    """One watch; ``EtcdClient.watch`` starts it, ``stop()`` ends it."""

    def __init__(self, client: EtcdClient, key: bytes, callback: Callable[[list[WatchEvent]], object], prefix: bool):
        self.client, self.key, self.callback = client, key, callback
        self.range_end = prefix_end(key) if prefix else None
        self.next_revision = 0  # 0: from now
        self.stopped = False
        self.waiting: defer.Deferred | None = None

    def start(self) -> None:
        defer.Deferred.fromCoroutine(self._run()).addErrback(
            lambda f: log.failure("the etcd watch on {key} ended", f, key=self.key))

    def stop(self) -> None:
        self.stopped = True
        self.client.watches.discard(self)
        if self.waiting is not None and not self.waiting.called:
            self.waiting.cancel()

    async def _run(self) -> None:
        delay = RETRY_FIRST_S
        while not self.stopped:
            url = self.client.urls[self.client.current]
            try:
                await self._follow(url)
                delay = RETRY_FIRST_S
            except defer.CancelledError:
                if self.stopped:
                    return
            except Exception as e:
                if self.stopped:
                    return
                if not isinstance(e, _Compacted):
                    log.info("the etcd watch on {key} at {url} ended: {why}; asking again",
                             key=self.key, url=url, why=describe(e))
                    self.client.current = (self.client.current + 1) % len(self.client.urls)
            if self.stopped:
                return
            self.waiting = task.deferLater(self.client.reactor, delay, lambda: None)
            try:
                await self.waiting
            except defer.CancelledError:
                return
            delay = min(delay * 2, RETRY_MOST_S)

    async def _follow(self, url: str) -> None:
        create: dict = {"key": b64(self.key)}
        if self.range_end is not None:
            create["range_end"] = b64(self.range_end)
        if self.next_revision:
            create["start_revision"] = str(self.next_revision)
        body = json.dumps({"create_request": create}).encode()
        asked = self.client.stream_agent.request(b"POST", (url + "/v3/watch").encode("ascii"), JSON_HEADERS, BodyBytes(body))
        asked.addTimeout(self.client.timeout_s, self.client.reactor)
        self.waiting = asked
        response = await asked
        if response.code != 200:
            reader = BoundedBody(self.client.max_response_bytes)
            response.deliverBody(reader)
            self.waiting = reader.done
            await reader.done
            raise BadAnswer(f"HTTP {response.code}")
        lines = _Lines(self.client.max_response_bytes, self._line)
        self.waiting = lines.done
        response.deliverBody(lines)
        await lines.done

    def _line(self, line: bytes) -> None:
        if not line.strip() or self.stopped:
            return
        try:
            answer = json.loads(line)
        except ValueError:
            raise BadAnswer("sent a line that is not JSON") from None
        if not isinstance(answer, dict) or "error" in answer:
            raise BadAnswer(f"sent an error: {str(answer)[:200]}")
        result = field_object(answer, "result")
        if result.get("canceled"):
            compacted = field_int(result, "compact_revision")
            if compacted:
                log.warn("etcd compacted revision {old} away; the watch on {key} resumes at {new}, "
                         "and changes between are not seen", old=self.next_revision, key=self.key, new=compacted)
                self.next_revision = compacted
                raise _Compacted()
            raise BadAnswer(f"canceled the watch: {str(result.get('cancel_reason', ''))[:200]}")
        if result.get("created") and not self.next_revision:
            self.next_revision = field_int(field_object(result, "header"), "revision") + 1
        events = []
        for event in field_list(result, "events"):
            if not isinstance(event, dict):
                raise BadAnswer("an event is not an object")
            kind = _KINDS.get(event.get("type", "PUT"))
            if kind is None:
                raise BadAnswer(f"an event of a type etcd does not send ({str(event.get('type'))[:40]})")
            kv = key_value(field_object(event, "kv"))
            events.append(WatchEvent(kind, kv))
            self.next_revision = max(self.next_revision, kv.mod_revision + 1)
        if events:
            try:
                self.callback(events)
            except Exception:
                log.failure("a watch's callback on {key} failed", key=self.key)
