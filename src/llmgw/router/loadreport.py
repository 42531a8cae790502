"""What this router tells the control plane of its traffic: ``llmgw.traffic.RouterLoad``, every second.

``build_load`` reads the figures where the router already keeps them, so the
request path pays nothing for the report:

- per model, from the dispatcher: requests holding a slot (its endpoints'
  ``inflight``, those on an endpoint gone from the table included), waiting in
  the admission queue, held for a cold start (``coldstart.py``), seconds since
  the last request for it arrived (``None``: none since the router started),
  and the engines' own waiting queues (the sum of what the endpoints' /metrics
  said; ``None`` when none said, which is always unless ``router.scoring`` is
  ``engine-load``, the policy under which they are read);
- per endpoint in the table, and per endpoint gone from it while requests are
  still on it: requests in flight (a draining replica stops once every router
  says 0);
- per model and per API key, counters since the router started, summed from
  ``RouterMetrics``'s own families (``elasticmetrics.Counted``): requests
  answered, tokens, errors by class ("4xx", "429", "5xx", "503" by the status
  the client got; "upstream": failures talking to an engine, each try), and
  time to first token (streamed answers) per ``TTFT_BUCKETS_MS``.

``LoadReporter`` sends one every ``REPORT_INTERVAL_S`` on the router's clock
to its ``sink`` (none: nothing is built), and one marked ``urgent`` as soon as
a request is held for a model that had none held, so a cold start does not
wait for the next second.  A report that cannot be built or handed over is
logged once, never raised into the request path.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from llmgw.traffic import (
    INFLIGHT,
    MANY,
    REPORT_INTERVAL_S,
    TTFT_BUCKETS_MS,
    EndpointLoad,
    KeyCounts,
    ModelCounts,
    ModelLoad,
    RouterLoad,
)

if TYPE_CHECKING:
    from llmgw.router.dispatch import Dispatcher
    from llmgw.router.elasticmetrics import Counted

log = Logger()

# The longest model name and key name a report carries (traffic.ModelLoad, KeyCounts): a longer one is left out.
MODEL_CHARS = 1024
KEY_CHARS = 256
# The histogram's bucket edges (seconds) that are TTFT_BUCKETS_MS's, by position.
_TTFT_EDGES = {ms / 1000: i for i, ms in enumerate(TTFT_BUCKETS_MS)}
_INF = math.inf


def _error_class(status: int) -> str | None:
    if status in (429, 503):
        return str(status)
    if 400 <= status < 500:
        return "4xx"
    if 500 <= status < 600:
        return "5xx"
    return None


def _clip(n: float) -> int:
    return min(INFLIGHT, max(0, int(n)))


def model_loads(dispatcher: Dispatcher, now: float) -> tuple[list[ModelLoad], list[EndpointLoad]]:
    """Each model's and each endpoint's load in *dispatcher* now."""
    cold = dispatcher.cold
    departed = [e for e in dispatcher.departed if e.inflight > 0]
    names = {e.model for e in dispatcher.endpoints()} | set(cold.policies) | set(cold.models())
    names |= set(dispatcher.arrived)
    names |= {e.model for e in departed}
    models = []
    for model in sorted(names):
        if len(model) > MODEL_CHARS:
            continue
        endpoints = dispatcher.endpoints(model)
        known = [e.engine_waiting for e in endpoints if e.engine_waiting is not None]
        arrived = dispatcher.arrived.get(model)
        models.append(ModelLoad(
            model,
            inflight=_clip(sum(e.inflight for e in endpoints) + sum(e.inflight for e in departed if e.model == model)),
            queued=_clip(dispatcher.queue_depth(model)),
            held=_clip(cold.count(model)),
            idle_s=None if arrived is None else max(0.0, now - arrived),
            engine_waiting=_clip(sum(known)) if known else None,
        ))
    inflight: dict[str, int] = {}
    for e in [*dispatcher.endpoints(), *departed]:
        if len(e.id) <= MODEL_CHARS:
            inflight[e.id] = inflight.get(e.id, 0) + e.inflight
    endpoints = [EndpointLoad(ident, _clip(n)) for ident, n in sorted(inflight.items())]
    return models[:MANY], endpoints[:MANY]


def _samples(family):
    for metric in family.collect():
        yield from metric.samples


def counts(counted: Counted) -> tuple[list[ModelCounts], list[KeyCounts]]:
    """The counters since the router started, per model and per key, summed from the metrics' families."""
    counted.flush()
    requests: dict[str, int] = {}
    errors: dict[str, dict[str, int]] = {}
    for s in _samples(counted.requests):
        if s.name.endswith("_total"):
            model, n = s.labels["model"], int(s.value)
            requests[model] = requests.get(model, 0) + n
            klass = _error_class(int(s.labels["status"]))
            if klass is not None and n:
                by_class = errors.setdefault(model, {})
                by_class[klass] = by_class.get(klass, 0) + n
    for s in _samples(counted.upstream_errors):
        if s.name.endswith("_total") and s.value:
            by_class = errors.setdefault(s.labels["model"], {})
            by_class["upstream"] = by_class.get("upstream", 0) + int(s.value)
    tokens: dict[tuple[str, str], int] = {}
    for s in _samples(counted.tokens):
        if s.name.endswith("_total"):
            tokens[(s.labels["model"], s.labels["kind"])] = int(s.value)
    # Cumulative counts at each of TTFT_BUCKETS_MS's edges, and +Inf last.
    cumulative: dict[str, list[int]] = {}
    for s in _samples(counted.ttft):
        if s.name.endswith("_bucket"):
            edge = float(s.labels["le"])
            at = len(TTFT_BUCKETS_MS) if edge == _INF else _TTFT_EDGES.get(edge)
            if at is not None:
                cumulative.setdefault(s.labels["model"], [0] * (len(TTFT_BUCKETS_MS) + 1))[at] = int(s.value)
    models = []
    for model in sorted(requests.keys() | errors.keys() | cumulative.keys()):
        if len(model) > MODEL_CHARS:
            continue
        cum = cumulative.get(model)
        ttft = [] if cum is None else [n - (cum[i - 1] if i else 0) for i, n in enumerate(cum)]
        models.append(ModelCounts(model, requests.get(model, 0), tokens.get((model, "prompt"), 0),
                                  tokens.get((model, "completion"), 0), errors.get(model, {}), ttft))
    keys: dict[str, list[int]] = {}
    for s in _samples(counted.key_requests):
        if s.name.endswith("_total"):
            keys.setdefault(s.labels["key"], [0, 0])[0] += int(s.value)
    for s in _samples(counted.key_tokens):
        if s.name.endswith("_total"):
            keys.setdefault(s.labels["key"], [0, 0])[1] += int(s.value)
    key_counts = [KeyCounts(k, r, t) for k, (r, t) in sorted(keys.items()) if len(k) <= KEY_CHARS]
    return models[:MANY], key_counts[:MANY]


def build_load(router: str, dispatcher: Dispatcher, counted: Counted | None, now: float,
               urgent: bool = False) -> RouterLoad:
    """This router's report now; without metrics (``counted`` None) it carries no counters."""
    models, endpoints = model_loads(dispatcher, now)
    model_counts, key_counts = counts(counted) if counted is not None else ([], [])
    return RouterLoad(router, models, endpoints, model_counts, key_counts, urgent)


class LoadReporter:
    """Hands ``build_load``'s report to ``sink`` every *interval_s*, and at once on a cold start (``urgent``)."""

    def __init__(self, clock: IReactorTime, dispatcher: Dispatcher, counted: Counted | None, router: str,
                 interval_s: float = REPORT_INTERVAL_S):
        self.clock = clock
        self.dispatcher = dispatcher
        self.counted = counted
        self.router = router
        self.interval_s = interval_s
        # Who takes the reports: the server's control plane in process, or a worker's TableSession.
        self.sink: Callable[[RouterLoad], None] | None = None
        self._loop = LoopingCall(self.send)
        self._loop.clock = clock
        self._urgent: IDelayedCall | None = None
        self._failing = False

    def start(self) -> None:
        if not self._loop.running:
            self._loop.start(self.interval_s, now=False)

    def stop(self) -> None:
        if self._loop.running:
            self._loop.stop()
        if self._urgent is not None and self._urgent.active():
            self._urgent.cancel()
        self._urgent = None

    def urgent(self, model: str) -> None:
        """A request is held for *model*, which had none held, or an endpoint left the table: report now.

        One report for all such in one turn of the reactor.
        """
        if self.sink is None or self._urgent is not None or not self._loop.running:
            return
        self._urgent = self.clock.callLater(0, self._send_urgent)

    def _send_urgent(self) -> None:
        self._urgent = None
        self.send(urgent=True)

    def send(self, urgent: bool = False) -> None:
        sink = self.sink
        if sink is None:
            return
        try:
            sink(build_load(self.router, self.dispatcher, self.counted, self.clock.seconds(), urgent))
        except Exception:
            if not self._failing:
                log.failure("the router's load report could not be made or handed over; "
                            "the next ones are tried, and logged again once one goes")
            self._failing = True
        else:
            self._failing = False
