"""etcd's v3 JSON gateway over Twisted's HTTP client: keys, leases, one transaction and watches, each bounded.

``EtcdClient(reactor, urls, tls=None, timeout_s=2, max_response_bytes=4 MiB)``
POSTs to etcd's gateway (``/v3/kv/range``, ``/v3/kv/put``, ``/v3/kv/txn``,
``/v3/kv/deleterange``, ``/v3/lease/grant``, ``/v3/lease/keepalive``,
``/v3/lease/revoke``, and the streamed ``/v3/watch`` in
``llmgw.ha.watch``), with keys and values base64 as the gateway's JSON has
them and its int64 fields as decimal strings.  Every answer must arrive
within ``timeout_s`` and be at most ``max_response_bytes``; one that is not,
is not JSON, or does not have the shape etcd gives is refused in words that
name the URL, and the next URL is asked, as it is when a member cannot be
reached or says it is unavailable.  The member that answered last is asked
first next time.  etcd's own refusal (a lease it does not know, a request it
cannot read) is not passed on to another member: it raises ``EtcdRefused``.

A request that timed out may still have been applied; ``claim`` is safe to
repeat (it reads back who holds the key), and a ``put`` writes the same
value twice.  No library was added: etcd's Python clients speak gRPC or are
synchronous, and the gateway is plain HTTP/1.1 and JSON.
"""

from __future__ import annotations

import base64
import json
import re
from typing import Any, Callable

import attrs
from twisted.internet import defer, ssl
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure
from twisted.web.client import Agent, ResponseDone
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import IBodyProducer, IPolicyForHTTPS
from zope.interface import implementer

from llmgw.text import printable
from llmgw.tlsfiles import TLSFiles
from llmgw.webclient import connection_pool

DEFAULT_TIMEOUT_S = 2.0
DEFAULT_MAX_RESPONSE_BYTES = 4 * 1024 * 1024
JSON_HEADERS = Headers({b"content-type": [b"application/json"]})
_INT = re.compile(r"-?[0-9]{1,19}")
# gRPC's codes in etcd's answers: NOT_FOUND (a lease it does not know) and those a member
# says when it cannot serve now (DEADLINE_EXCEEDED, UNAVAILABLE): another member may.
GRPC_NOT_FOUND = 5
_ASK_ANOTHER = frozenset({4, 14})


class EtcdError(Exception):
    """etcd could not be asked, or refused; the text names the URL and what to do."""


class EtcdUnavailable(EtcdError):
    """No etcd URL answered; the text names each URL and what went wrong with it."""


class EtcdRefused(EtcdError):
    """etcd answered with an error of its own (``code``: gRPC's)."""

    def __init__(self, text: str, code: int | None = None):
        super().__init__(text)
        self.code = code


class EtcdClosed(EtcdError):
    """The client was closed (the server is stopping); nothing more is asked of etcd."""


class BadAnswer(Exception):
    """An answer not of the shape etcd gives: the member is passed over like one that cannot be reached."""


@attrs.frozen
class KeyValue:
    """A key as etcd holds it.  ``lease`` is 0 when none; revisions are 0 in a deletion's event."""

    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int = 0


# -- reading etcd's JSON: proto3 leaves out every zero, int64 fields are strings --


def field_int(obj: dict, name: str) -> int:
    value = obj.get(name, 0)
    if isinstance(value, str) and _INT.fullmatch(value):
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not -(2**63) <= value < 2**63:
        raise BadAnswer(f"{name} is not an int64 ({printable(repr(value))[:40]})")
    return value


def field_bytes(obj: dict, name: str) -> bytes:
    value = obj.get(name, "")
    if not isinstance(value, str):
        raise BadAnswer(f"{name} is not base64 text")
    try:
        return base64.b64decode(value, validate=True)
    except ValueError:
        raise BadAnswer(f"{name} is not base64") from None


def field_object(obj: dict, name: str) -> dict:
    value = obj.get(name, {})
    if not isinstance(value, dict):
        raise BadAnswer(f"{name} is not an object")
    return value


def field_list(obj: dict, name: str) -> list:
    value = obj.get(name, [])
    if not isinstance(value, list):
        raise BadAnswer(f"{name} is not a list")
    return value


def key_value(obj: Any) -> KeyValue:
    if not isinstance(obj, dict):
        raise BadAnswer("a key is not an object")
    return KeyValue(field_bytes(obj, "key"), field_bytes(obj, "value"), field_int(obj, "create_revision"),
                    field_int(obj, "mod_revision"), field_int(obj, "lease"))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def as_bytes(key: str | bytes) -> bytes:
    return key.encode("utf-8") if isinstance(key, str) else key


def prefix_end(prefix: bytes) -> bytes:
    """The range_end that makes a range every key starting with *prefix* (etcd's own rule)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return b"\0"  # every key
    return stripped[:-1] + bytes([stripped[-1] + 1])


def etcd_words(obj: dict) -> tuple[int | None, str]:
    """gRPC's code and etcd's message from an error answer, the message printable and short."""
    error = obj.get("error")
    inner = error if isinstance(error, dict) else obj
    code = inner.get("grpc_code", inner.get("code"))
    message = inner.get("message") or error or "no message"
    return (code if isinstance(code, int) else None), printable(str(message))[:300]


# -- the HTTP side --


@implementer(IBodyProducer)
class BodyBytes:
    def __init__(self, data: bytes):
        self.data, self.length = data, len(data)

    def startProducing(self, consumer):
        consumer.write(self.data)
        return defer.succeed(None)

    def pauseProducing(self):
        pass

    def resumeProducing(self):
        pass

    def stopProducing(self):
        pass


class BoundedBody(Protocol):
    """Collects a response's body, giving up (and dropping the connection) past *limit* bytes."""

    def __init__(self, limit: int):
        self.limit, self.parts, self.size = limit, [], 0
        self.done: defer.Deferred[bytes] = defer.Deferred(lambda _: self._abort())

    def _abort(self) -> None:
        if self.transport is not None:
            self.transport.stopProducing()

    def dataReceived(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > self.limit:
            self._abort()
            if not self.done.called:
                self.done.errback(BadAnswer(f"answered more than ha.max_response_bytes ({self.limit})"))
            return
        self.parts.append(data)

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
        if self.done.called:
            return
        if reason is None or reason.check(ResponseDone, PotentialDataLoss):
            self.done.callback(b"".join(self.parts))
        else:
            self.done.errback(BadAnswer(f"the answer broke off: {reason.getErrorMessage()}"))


@implementer(IPolicyForHTTPS)
class EtcdTLS:
    """https:// to etcd: its certificate checked against ``tls.ca``, ours shown from ``tls.cert``/``tls.key``."""

    def __init__(self, files: TLSFiles):
        with open(files.ca, "rb") as f:
            self.ca = ssl.Certificate.loadPEM(f.read())
        with open(files.cert, "rb") as f, open(files.key, "rb") as k:
            self.ours = ssl.PrivateCertificate.loadPEM(f.read() + b"\n" + k.read())

    def creatorForNetloc(self, hostname: bytes, port: int):
        return ssl.optionsForClientTLS(hostname.decode("ascii"), trustRoot=self.ca, clientCertificate=self.ours)


def describe(failure: BaseException) -> str:
    if isinstance(failure, defer.TimeoutError):
        return "no answer in time"
    text = str(failure) or type(failure).__name__
    return printable(text)[:300]


class EtcdClient:
    """etcd's gateway at *urls*, one tried after another (see the module's text)."""

    def __init__(self, reactor, urls: list[str] | tuple[str, ...], tls: TLSFiles | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES):
        if not urls:
            raise ValueError("give at least one etcd URL")
        self.reactor = reactor
        self.urls = [u.rstrip("/") for u in urls]
        self.timeout_s = timeout_s
        self.max_response_bytes = max_response_bytes
        self.current = 0  # the member that answered last
        self.closed = False
        self.watches: set = set()
        self.pool = connection_pool(reactor, persistent=True)
        policy = EtcdTLS(tls) if tls is not None else None
        extra = {"contextFactory": policy} if policy is not None else {}
        self.agent = Agent(reactor, connectTimeout=timeout_s, pool=self.pool, **extra)
        self.stream_agent = Agent(reactor, connectTimeout=timeout_s,
                                  pool=connection_pool(reactor, persistent=False), **extra)

    # -- keys --

    def get(self, key: str | bytes) -> defer.Deferred[KeyValue | None]:
        def read(answer: dict) -> KeyValue | None:
            kvs = [key_value(kv) for kv in field_list(answer, "kvs")]
            return kvs[0] if kvs else None
        return self.ask("/v3/kv/range", {"key": b64(as_bytes(key))}, read)

    def get_prefix(self, prefix: str | bytes) -> defer.Deferred[list[KeyValue]]:
        raw = as_bytes(prefix)
        return self.ask("/v3/kv/range", {"key": b64(raw), "range_end": b64(prefix_end(raw))},
                        lambda answer: [key_value(kv) for kv in field_list(answer, "kvs")])

    def put(self, key: str | bytes, value: bytes, lease: int | None = None) -> defer.Deferred[None]:
        request: dict[str, Any] = {"key": b64(as_bytes(key)), "value": b64(value)}
        if lease:
            request["lease"] = str(lease)
        return self.ask("/v3/kv/put", request, lambda answer: None)

    def delete(self, key: str | bytes, prefix: bool = False) -> defer.Deferred[int]:
        """Delete *key* (every key under it with *prefix*); the number deleted."""
        raw = as_bytes(key)
        request = {"key": b64(raw), **({"range_end": b64(prefix_end(raw))} if prefix else {})}
        return self.ask("/v3/kv/deleterange", request, lambda answer: field_int(answer, "deleted"))

    def claim(self, key: str | bytes, value: bytes, lease: int) -> defer.Deferred[tuple[bool, KeyValue | None]]:
        """Put *key* under *lease* only if it does not exist: (whether it was put, the key as it is now).

        One transaction, so the holder comes back with a refusal, and the
        winner's ``create_revision`` (the election's epoch) with a success.
        """
        raw = as_bytes(key)
        look = {"request_range": {"key": b64(raw)}}
        request = {
            "compare": [{"key": b64(raw), "result": "EQUAL", "target": "CREATE", "create_revision": "0"}],
            "success": [{"request_put": {"key": b64(raw), "value": b64(value), "lease": str(lease)}}, look],
            "failure": [look],
        }

        def read(answer: dict) -> tuple[bool, KeyValue | None]:
            succeeded = answer.get("succeeded", False)
            if not isinstance(succeeded, bool):
                raise BadAnswer("succeeded is not true or false")
            responses = field_list(answer, "responses")
            if not responses or not isinstance(responses[-1], dict):
                raise BadAnswer("a transaction's answer has no responses")
            kvs = [key_value(kv) for kv in field_list(field_object(responses[-1], "response_range"), "kvs")]
            return succeeded, (kvs[0] if kvs else None)
        return self.ask("/v3/kv/txn", request, read)

    def create(self, key: str | bytes, value: bytes, lease: int) -> defer.Deferred[bool]:
        """Whether *key* was put under *lease*; False when it already exists."""
        return self.claim(key, value, lease).addCallback(lambda result: result[0])

    # -- leases --

    def grant(self, ttl_s: int) -> defer.Deferred[int]:
        def read(answer: dict) -> int:
            lease = field_int(answer, "ID")
            if lease == 0:
                raise BadAnswer("a granted lease has no ID")
            return lease
        return self.ask("/v3/lease/grant", {"TTL": int(ttl_s)}, read)

    def keepalive(self, lease: int) -> defer.Deferred[int]:
        """The lease's TTL in seconds after renewing it; 0: etcd no longer has it."""
        # A stream in gRPC; the gateway answers one {"result": ...} line per request line.
        return self.ask("/v3/lease/keepalive", {"ID": str(lease)},
                        lambda answer: max(0, field_int(field_object(answer, "result"), "TTL")), stream=True)

    def revoke(self, lease: int) -> defer.Deferred[None]:
        """Revoke *lease*, and with it its keys; one etcd no longer has is no error."""
        def gone(failure: Failure) -> None:
            failure.trap(EtcdRefused)
            if failure.value.code != GRPC_NOT_FOUND:
                return failure  # type: ignore[return-value]
            return None
        return self.ask("/v3/lease/revoke", {"ID": str(lease)}, lambda answer: None).addErrback(gone)

    # -- watches --

    def watch(self, key: str | bytes, callback: Callable, prefix: bool = False):
        """Call *callback(events)* with each batch of ``WatchEvent`` on *key* (or under it); ``.stop()`` ends it."""
        from llmgw.ha.watch import Watch

        watch = Watch(self, as_bytes(key), callback, prefix)
        self.watches.add(watch)
        watch.start()
        return watch

    def close(self) -> defer.Deferred[None]:
        """Ask etcd nothing more: watches end, later calls raise ``EtcdClosed``, idle connections close."""
        self.closed = True
        for watch in list(self.watches):
            watch.stop()
        return self.pool.closeCachedConnections()

    # -- one call, member after member --

    def ask(self, path: str, request: dict, read: Callable[[dict], Any], stream: bool = False) -> defer.Deferred:
        """POST *request* to *path*, member after member; *read* the answer (``BadAnswer``: the next member)."""
        return defer.Deferred.fromCoroutine(self.call(path, request, read, stream))

    async def call(self, path: str, request: dict, read: Callable[[dict], Any], stream: bool = False) -> Any:
        body = json.dumps(request).encode()
        failures = []
        for step in range(len(self.urls)):
            if self.closed:
                raise EtcdClosed("the etcd client is closed")
            index = (self.current + step) % len(self.urls)
            url = self.urls[index]
            try:
                answer = read(await self._ask(url + path, body, stream))
            except BadAnswer as e:
                failures.append(f"{url} answered wrongly: {e}")
                continue
            except _AskAnother as e:
                failures.append(f"{url}: {e}")
                continue
            except EtcdRefused as e:
                self.current = index
                raise EtcdRefused(f"etcd at {url} refused {path}: {e}", e.code) from None
            self.current = index
            return answer
        raise EtcdUnavailable(
            f"no etcd member answered {path} ({'; '.join(failures)}); check ha.etcd and that etcd runs")

    async def _ask(self, url: str, body: bytes, stream: bool) -> dict:
        async def post() -> tuple[int, bytes]:
            response = await self.agent.request(b"POST", url.encode("ascii"), JSON_HEADERS, BodyBytes(body))
            if isinstance(response.length, int) and response.length > self.max_response_bytes:
                refused = BoundedBody(0)
                refused.done.addErrback(lambda _: None)
                response.deliverBody(refused)  # drops the connection at its first byte
                raise BadAnswer(f"would answer {response.length} bytes, more than ha.max_response_bytes "
                                f"({self.max_response_bytes})")
            reader = BoundedBody(self.max_response_bytes)
            response.deliverBody(reader)
            return response.code, await reader.done

        def late(result: object, timeout: float) -> Failure:
            # Whatever the cancelled request raised (ResponseNeverReceived, a body cut short), it was too slow.
            return Failure(_AskAnother(f"no answer within {timeout:g} s (ha.request_timeout_s)"))

        asked = defer.Deferred.fromCoroutine(post())
        asked.addTimeout(self.timeout_s, self.reactor, onTimeoutCancel=late)
        try:
            status, data = await asked
        except (BadAnswer, _AskAnother):
            raise
        except Exception as e:
            raise _AskAnother(describe(e)) from None
        if stream:
            data = data.split(b"\n", 1)[0]
        try:
            answer = json.loads(data)
        except ValueError:
            raise BadAnswer(f"answered HTTP {status} with something that is not JSON") from None
        if not isinstance(answer, dict):
            raise BadAnswer("answered JSON that is not an object")
        if status != 200 or "error" in answer:
            code, words = etcd_words(answer)
            if code in _ASK_ANOTHER or (code is None and status >= 500):
                raise _AskAnother(f"HTTP {status}: {words}")
            raise EtcdRefused(f"HTTP {status}: {words}", code)
        return answer


class _AskAnother(Exception):
    """This member could not answer now: the next one is asked."""
