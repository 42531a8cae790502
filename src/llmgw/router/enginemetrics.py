"""An engine's own load, read from its Prometheus ``/metrics``, for ``scoring: engine-load``.

``parse_engine_metrics(text)`` turns the exposition of vLLM, SGLang,
llama.cpp (``--metrics``) or llmgw's sim (vLLM's names) into
``EngineFigures(running, waiting, kv_usage)``.  A family the engine does not
export stays ``None`` — unknown, never zero — so an engine that says nothing
is not mistaken for an idle one.  When an engine exports a family more than
once (vLLM's data-parallel ranks, one sample each), the counts are summed
and the KV-cache usage is averaged.

``EnginePoller`` reads every endpoint's ``/metrics`` every ``interval_s``
through an injected ``fetch(url) -> Deferred[bytes]`` and writes the figures
onto the ``Endpoint``; a fetch that fails or times out makes them unknown
again rather than leaving stale ones.  It does not judge health: only real
requests do (``dispatch.py``).  An endpoint whose fetch fails rests: after
k failures in a row it is asked again only every 2**(k-1) polls, at most
every ``MAX_REST_S``; the failure is logged once, and the recovery.

What an engine sends is not trusted: ``fetch_metrics`` reads at most
``max_bytes`` of the page and drops the connection past that, and the poller
takes an injected ``parse`` so the service can parse in a worker thread: a
page of many thousands of load samples must not stall the requests relayed
on the reactor.
"""

from __future__ import annotations

import math
import re
from typing import Callable, Iterable

import attrs
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet import defer
from twisted.internet.interfaces import IReactorTime
from twisted.internet.protocol import Protocol
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.web.client import PotentialDataLoss, ResponseDone

from llmgw.router.scoring import Endpoint

# In order of preference, each engine's name for the same figure.
RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs", "llamacpp:requests_processing")
WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "llamacpp:requests_deferred")
KV_USAGE = (
    "vllm:kv_cache_usage_perc",  # vLLM V1
    "vllm:gpu_cache_usage_perc",  # vLLM V0 and sim; a fraction despite the name
    "sglang:token_usage",
    "llamacpp:kv_cache_usage_ratio",
)

# Only the lines of these families reach the parser: a vLLM exposition is
# mostly histograms, and parsing all of it every poll would cost more than
# the figures are worth.
_WANTED = re.compile(
    r"^(?:# (?:HELP|TYPE) )?(?:%s)(?:[ \t{].*)?$" % "|".join(re.escape(n) for n in RUNNING + WAITING + KV_USAGE),
    re.MULTILINE,
)

log = Logger()

MAX_REST_S = 60.0


@attrs.frozen
class EngineFigures:
    """Requests running and waiting in the engine, and its KV cache in use (0 to 1); ``None``: not reported."""

    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None


UNKNOWN = EngineFigures()


def parse_engine_metrics(text: str | bytes) -> EngineFigures:
    """The load figures in a Prometheus text exposition; ``ValueError`` if their lines are malformed."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    wanted = "\n".join(m.group(0) for m in _WANTED.finditer(text))
    values: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(wanted + "\n"):
        for sample in family.samples:
            if sample.name == family.name and not math.isnan(sample.value):
                values.setdefault(sample.name, []).append(float(sample.value))

    def first(names: tuple[str, ...], combine: Callable[[list[float]], float]) -> float | None:
        for name in names:
            if values.get(name):
                return combine(values[name])
        return None

    return EngineFigures(
        running=first(RUNNING, sum),
        waiting=first(WAITING, sum),
        kv_usage=first(KV_USAGE, lambda v: sum(v) / len(v)),
    )


def apply(endpoint: Endpoint, figures: EngineFigures) -> None:
    """Write *figures* onto *endpoint*, noting its in-flight count they correspond to."""
    endpoint.engine_running = figures.running
    endpoint.engine_waiting = figures.waiting
    endpoint.kv_usage = figures.kv_usage
    known = figures != UNKNOWN
    endpoint.engine_inflight_at_report = endpoint.inflight if known else None


class PageTooLarge(Exception):
    """An engine's /metrics page is over the size the router reads."""


class _CappedBody(Protocol):
    def __init__(self, d: defer.Deferred[bytes], max_bytes: int):
        self._d = d
        self._max = max_bytes
        self._parts: list[bytes] = []
        self._size = 0

    def dataReceived(self, data: bytes) -> None:
        if self._d.called:
            return
        self._size += len(data)
        if self._size > self._max:
            self._parts = []
            self.transport.stopProducing()
            self._d.errback(PageTooLarge(f"the page is over router.engines.metrics_max_bytes ({self._max} bytes)"))
            return
        self._parts.append(data)

    def connectionLost(self, reason=None) -> None:
        if self._d.called:
            return
        if reason is None or reason.check(ResponseDone, PotentialDataLoss):
            self._d.callback(b"".join(self._parts))
        else:
            self._d.errback(reason)


def read_capped(response, max_bytes: int) -> defer.Deferred[bytes]:
    """``response``'s body, failing with ``PageTooLarge`` (and the connection dropped) past ``max_bytes``."""

    def cancel(_) -> None:
        if body.transport is not None:
            body.transport.stopProducing()

    d: defer.Deferred[bytes] = defer.Deferred(cancel)
    body = _CappedBody(d, max_bytes)
    response.deliverBody(body)
    length = response.length
    if response.code != 200:
        d.cancel()
        d.addErrback(lambda _: None)
        return defer.fail(ValueError(f"it answered HTTP {response.code}"))
    if isinstance(length, int) and length > max_bytes:
        d.cancel()
        d.addErrback(lambda _: None)
        return defer.fail(PageTooLarge(f"it announces {length} bytes, over router.engines.metrics_max_bytes "
                                       f"({max_bytes})"))
    return d


def fetch_metrics(agent, url: str, max_bytes: int) -> defer.Deferred[bytes]:
    """GET ``url`` with a twisted.web ``agent``, reading at most ``max_bytes`` of the page."""
    return agent.request(b"GET", url.encode()).addCallback(read_capped, max_bytes)


class EnginePoller:
    """Polls each endpoint's ``/metrics``, at most one fetch per endpoint at a time.

    ``parse(page)`` gives the figures, or a Deferred of them (the service's
    parses in a thread); by default ``parse_engine_metrics``, inline.
    """

    def __init__(
        self,
        clock: IReactorTime,
        fetch: Callable[[str], defer.Deferred[bytes]],
        interval_s: float = 2.0,
        timeout_s: float | None = None,
        parse: Callable[[bytes], EngineFigures | defer.Deferred[EngineFigures]] = parse_engine_metrics,
    ):
        self._clock = clock
        self._fetch = fetch
        self._parse = parse
        self.interval_s = interval_s
        self.timeout_s = 2 * interval_s if timeout_s is None else timeout_s
        self._busy: set[str] = set()
        self._failing: set[str] = set()
        # Per failing endpoint: failures in a row, and polls still to skip.
        self._failures: dict[str, int] = {}
        self._resting: dict[str, int] = {}
        self._loop: LoopingCall | None = None

    @property
    def running(self) -> bool:
        return self._loop is not None and self._loop.running

    def start(self, endpoints: Callable[[], Iterable[Endpoint]]) -> None:
        """Poll ``endpoints()`` now and every ``interval_s`` (``Dispatcher.endpoints`` fits)."""
        self.stop()

        def tick() -> None:
            # Not returned: one slow engine must not hold back the others' polls.
            self.poll(endpoints())

        self._loop = LoopingCall(tick)
        self._loop.clock = self._clock
        self._loop.start(self.interval_s, now=True)

    def stop(self) -> None:
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None

    def poll(self, endpoints: Iterable[Endpoint]) -> defer.Deferred[None]:
        """Fetch every endpoint not still being fetched; fires when those fetches are done."""
        pending = []
        resting = self._resting
        for endpoint in endpoints:
            ident = endpoint.id
            if resting.get(ident):
                resting[ident] -= 1
                continue
            if ident not in self._busy:
                self._busy.add(ident)
                pending.append(self._poll_one(endpoint))
        return defer.gatherResults(pending).addCallback(lambda _: None)

    def _poll_one(self, endpoint: Endpoint) -> defer.Deferred[None]:
        url = endpoint.url + "/metrics"
        try:
            d = self._fetch(url)
        except Exception:
            d = defer.fail()
        d.addTimeout(self.timeout_s, self._clock)
        d.addCallback(self._parse)

        def done(figures: EngineFigures) -> None:
            self._failures.pop(endpoint.id, None)
            self._resting.pop(endpoint.id, None)
            if endpoint.id in self._failing:
                self._failing.discard(endpoint.id)
                log.info("engine load of {endpoint} readable again from {url}", endpoint=endpoint.id, url=url)
            apply(endpoint, figures)

        def failed(failure) -> None:
            failures = self._failures[endpoint.id] = self._failures.get(endpoint.id, 0) + 1
            most = max(0, math.ceil(MAX_REST_S / self.interval_s) - 1)
            self._resting[endpoint.id] = min(2 ** min(failures - 1, 30) - 1, most)
            if endpoint.id not in self._failing:
                self._failing.add(endpoint.id)
                log.info(
                    "engine load of {endpoint} unknown until {url} answers (asked less often meanwhile, "
                    "at least every {rest:g} s): {why}",
                    rest=MAX_REST_S,
                    endpoint=endpoint.id,
                    url=url,
                    why=failure.getErrorMessage() or failure.type.__name__,
                )
            apply(endpoint, UNKNOWN)

        d.addCallbacks(done, failed)
        d.addBoth(lambda _: self._busy.discard(endpoint.id))
        return d
