"""What the router tells Prometheus: traffic, queues, endpoints and keys.

``RouterMetrics`` owns its families in a registry it is given — never the
process-wide default — so two routers in one process, or two tests, cannot
collide.  Its methods are what the router calls; each is a dictionary lookup
and an increment or two, cheap enough for every request.  ``NullMetrics``
has the same methods and does nothing, for a router run without metrics.

Absent is not zero: a figure an engine did not report (time to first token
on a non-streaming reply, usage it left out, a load gauge it does not have)
is not recorded, so its series stays absent rather than reading as an idle
engine or a free request.

Labels are bounded, and never carry what a client made up.  ``path`` is one
of the API's routes or ``other``.  ``model`` is a model this router serves
or the catalog names (``set_models``, from the router's table); any other
name a request gives — an unauthenticated 401, a 404 — is ``unknown``, so
300 keyless requests naming 4,000-character models add one series, not 300.
Beyond that, ``MAX_MODELS`` distinct values, the rest ``other``.  Keys are
labelled by their configured name, never by their token.  See
docs/metrics.rst for every family.
"""

from __future__ import annotations

import platform
from typing import Any, Callable

import twisted
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.registry import Collector

from llmgw import __version__
from llmgw.router import errors
from llmgw.router.continuationmetrics import ContinuationMetrics
from llmgw.router.elasticmetrics import Counted, ElasticMetrics
from llmgw.router.fairmetrics import FairMetrics
from llmgw.router.routes import PATHS

PREFIX = "llmgw_router_"

# The model label for a request naming a model the router does not serve.
UNKNOWN_MODEL = "unknown"
OTHER = "other"
MAX_MODELS = 500


# The router answers its own errors, /v1/models and a cached engine's reply
# in well under a millisecond: buckets start at 0.1 ms, so those percentiles
# are measured rather than interpolated below a 5 ms bucket.  Out to a long
# generation (minutes).
SUB_MS_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025)
DURATION_BUCKETS = SUB_MS_BUCKETS + (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                                     20.0, 30.0, 60.0, 120.0, 300.0, 600.0)
# Time to first token is dominated by prefill and queueing: finer below a
# second, where interactive users notice, and out to a minute for a long
# prompt behind a full batch.
TTFT_BUCKETS = SUB_MS_BUCKETS + (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 0.75, 1.0,
                                 1.5, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0)
QUEUE_WAIT_BUCKETS = SUB_MS_BUCKETS + (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                                       10.0, 30.0, 60.0, 120.0)
# A one-line prompt to a long context's worth of JSON.
BODY_BUCKETS = (256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)

ENDPOINT_STATES = ("healthy", "unhealthy")

# The router's refusals before an engine, by class: what
# llmgw_router_admission_rejections_total's ``reason`` says.
REJECTIONS = {
    errors.QueueFull: "queue_full",
    errors.QueueTimeout: "queue_timeout",
    errors.NoReadyEndpoint: "no_endpoint",
    errors.UnknownModel: "unknown_model",
    errors.RateLimited: "rate_limited",
    errors.Unauthorized: "unauthorized",
    errors.Forbidden: "forbidden",
    errors.BodyTooLarge: "body_too_large",
    errors.InvalidRequest: "bad_request",
}


def rejection_reason(error: Exception) -> str | None:
    """``error``'s reason as an admission rejection, or None when it is not one (an engine's failure, a 408)."""
    return REJECTIONS.get(error.__class__)


class _Refresh(Collector):
    """Registered before the families: as a scrape begins, adds what was tallied and calls the router's ``refresh``.

    A scrape runs on the reactor's thread (the admin listener is
    twisted.web in the same reactor), as every recording method does.
    """

    def __init__(self, flush: Callable[[], None]):
        self.flush = flush
        self.refresh: Callable[[], None] | None = None

    def describe(self):
        return []

    def collect(self):
        self.flush()
        if self.refresh is not None:
            self.refresh()
        return []


class _Tally:
    """A counter's increments summed in a plain dict between scrapes, added to its children as a scrape begins.

    For figures recorded several times per request: a dict update costs a
    small fraction of prometheus_client's locked ``inc``, and the counter is
    as exact at the scrape.
    """

    __slots__ = ("children", "pending")

    def __init__(self, children: _Children):
        self.children = children
        self.pending: dict[tuple, float] = {}

    def add(self, values: tuple, n: float) -> None:
        pending = self.pending
        pending[values] = pending.get(values, 0) + n

    def flush(self) -> None:
        pending, self.pending = self.pending, {}
        for values, n in pending.items():
            self.children(*values).inc(n)


class _Children:
    """A family's children by raw label tuple, so the hot path skips ``labels()``'s checks and lock."""

    __slots__ = ("metric", "children")

    def __init__(self, metric):
        self.metric = metric
        self.children: dict[tuple, Any] = {}

    def __call__(self, *values):
        child = self.children.get(values)
        if child is None:
            child = self.children[values] = self.metric.labels(*values)
        return child

    def remove(self, *values) -> None:
        self.children.pop(values, None)
        self.metric.remove(*values)


class RouterMetrics:
    """The router's metric families, registered in ``registry``."""

    def __init__(self, registry: CollectorRegistry, max_models: int = MAX_MODELS):
        self._max_models = max_models
        self._models: set[str] = set()
        # None until the router has a table: then every name is taken, up to max_models.
        self._known: frozenset[str] | None = None
        self._statuses: dict[int, tuple[str, str]] = {}
        self._health: dict[tuple[str, str], bool] = {}
        # First in the registry, so what it refreshes is current before the families are read.
        self._refresh = _Refresh(self._flush)
        registry.register(self._refresh)
        # Requests in flight per model label, set on the gauge as a scrape begins.
        self._live: dict[str, int] = {}

        def counter(name, doc, labels):
            return _Children(Counter(PREFIX + name, doc, labels, registry=registry))

        def gauge(name, doc, labels):
            return _Children(Gauge(PREFIX + name, doc, labels, registry=registry))

        def histogram(name, doc, labels, buckets):
            return _Children(Histogram(PREFIX + name, doc, labels, buckets=buckets, registry=registry))

        build = Info(PREFIX + "build", "The router's version and what it runs on.", registry=registry)
        build.info({"version": __version__, "python": platform.python_version(), "twisted": twisted.__version__})

        # -- requests --
        self._requests = counter("requests_total", "Requests answered, by model, API path and HTTP status.",
                                 ["model", "path", "status"])
        self._responses = counter("responses_total", "Requests answered, by model and HTTP status class (2xx, 4xx, 5xx).",
                                  ["model", "class"])
        self._duration = histogram("request_duration_seconds",
                                   "Time from a request's arrival to its last byte sent, by model and API path.",
                                   ["model", "path"], DURATION_BUCKETS)
        self._ttft = histogram("time_to_first_token_seconds",
                               "Time from a streaming request's arrival to its first token sent to the client.",
                               ["model"], TTFT_BUCKETS)
        self._tokens = counter("tokens_total", "Tokens the engines reported in usage, by kind (prompt, completion).",
                               ["model", "kind"])
        self._in_flight = gauge("requests_in_flight", "Requests being served now, queued ones included.", ["model"])
        self._body = histogram("request_body_bytes", "Size of request bodies received, by API path.",
                               ["path"], BODY_BUCKETS)
        self._bytes = counter("relayed_bytes_total",
                              "Body bytes relayed, by direction (request: client to engine; response: engine to client).",
                              ["model", "direction"])
        self._client_gone = counter("client_disconnects_total",
                                    "Requests whose client went away before the reply ended (the upstream is aborted).",
                                    ["model"])
        self._client_timeouts = counter("client_timeouts_total",
                                        "Client connections ended by a limit, by kind (idle, head, body, write_stall).",
                                        ["kind"])
        self._connections = Gauge(PREFIX + "client_connections", "API connections open now.", registry=registry)
        self._connections_refused = Counter(PREFIX + "client_connections_refused_total",
                                            "API connections refused because router.clients.max_connections were open.",
                                            registry=registry)
        # -- upstream --
        self._upstream_errors = counter("upstream_errors_total",
                                        "Failures talking to an endpoint, by kind (connect, timeout, reset, status, ...).",
                                        ["model", "endpoint", "kind"])
        self._retries = counter("retries_total",
                                "Requests sent again to another endpoint after failing before their first byte.",
                                ["model"])
        self._pool = gauge("upstream_connections", "Pooled connections to an endpoint, by state (idle, active).",
                           ["endpoint", "state"])
        # -- admission --
        self._queue_depth = gauge("queue_depth", "Requests waiting for an endpoint slot now.", ["model"])
        self._queue_wait = histogram("queue_wait_seconds", "Time requests waited in the queue before an endpoint took them.",
                                     ["model"], QUEUE_WAIT_BUCKETS)
        self._rejected = counter("admission_rejections_total",
                                 "Requests refused before reaching an engine, by reason.", ["model", "reason"])
        # -- scoring --
        self._scored = counter("scoring_decisions_total",
                               "Endpoint choices, by how the choice was made (least_outstanding, affinity_hit, "
                               "affinity_spill, engine_load).", ["model", "decision"])
        # -- endpoints --
        self._healthy = gauge("endpoint_healthy", "1 while an endpoint passes its health checks, 0 when it does not.",
                              ["endpoint", "model"])
        self._ep_inflight = gauge("endpoint_in_flight_requests", "Requests the router has outstanding at an endpoint.",
                                  ["endpoint", "model"])
        self._ep_running = gauge("endpoint_engine_running_requests",
                                 "Requests the engine itself reports running (absent when it does not report them).",
                                 ["endpoint", "model"])
        self._ep_waiting = gauge("endpoint_engine_waiting_requests",
                                 "Requests the engine itself reports waiting (absent when it does not report them).",
                                 ["endpoint", "model"])
        self._ep_kv = gauge("endpoint_kv_cache_usage_ratio",
                            "Fraction of the engine's KV cache in use, 0 to 1 (absent when it does not report it).",
                            ["endpoint", "model"])
        self._endpoints = gauge("endpoints", "Endpoints the router knows, by state (healthy, unhealthy).", ["state"])
        for state in ENDPOINT_STATES:
            # A count is always known, so zero is a true zero here.
            self._endpoints(state).set(0)
        # -- keys --
        self._key_requests = counter("key_requests_total", "Requests per API key, by the key's configured name.",
                                     ["key", "model"])
        self._key_tokens = counter("key_tokens_total",
                                   "Tokens per API key, by the key's configured name and kind (prompt, completion).",
                                   ["key", "kind"])
        self._tallies = (_Tally(self._bytes), _Tally(self._key_requests), _Tally(self._key_tokens))
        self._bytes_tally, self._key_requests_tally, self._key_tokens_tally = self._tallies
        # Held requests (elasticmetrics.py), and the families the load report sums (loadreport.py).
        self.elastic = ElasticMetrics(registry, self._model)
        self.fair = FairMetrics(registry, self._model)
        self.continuation = ContinuationMetrics(registry, self._model)
        self.counted = Counted(self._flush, self._requests.metric, self._tokens.metric, self._ttft.metric,
                               self._upstream_errors.metric, self._key_requests.metric, self._key_tokens.metric)

    def _flush(self) -> None:
        for tally in self._tallies:
            tally.flush()
        for model, n in self._live.items():
            self._in_flight(model).set(n)

    def refresh_with(self, refresh: Callable[[], None] | None) -> None:
        """Call ``refresh`` at the start of every scrape: the router reports its endpoints and pool then."""
        self._refresh.refresh = refresh

    # -- label hygiene --

    def set_models(self, names) -> None:
        """The model names a request may be labelled with: those served or in the catalog."""
        self._known = frozenset(names)

    def _model(self, model: str) -> str:
        if model in self._models:
            return model
        if self._known is not None and model not in self._known:
            return UNKNOWN_MODEL
        if len(self._models) >= self._max_models:
            return OTHER
        self._models.add(model)
        return model

    def _status(self, status: int) -> tuple[str, str]:
        pair = self._statuses.get(status)
        if pair is None:
            pair = self._statuses[status] = (str(status), f"{status // 100}xx")
        return pair

    # -- requests --

    def request_done(self, model: str, path: str, status: int, seconds: float,
                     ttft_seconds: float | None, prompt_tokens: int | None,
                     completion_tokens: int | None) -> None:
        model = self._model(model)
        if path not in PATHS:
            path = OTHER
        code, klass = self._status(status)
        self._requests(model, path, code).inc()
        self._responses(model, klass).inc()
        self._duration(model, path).observe(seconds)
        if ttft_seconds is not None:
            self._ttft(model).observe(ttft_seconds)
        if prompt_tokens is not None:
            self._tokens(model, "prompt").inc(prompt_tokens)
        if completion_tokens is not None:
            self._tokens(model, "completion").inc(completion_tokens)

    def request_started(self, model: str) -> None:
        live, model = self._live, self._model(model)
        live[model] = live.get(model, 0) + 1

    def request_finished(self, model: str) -> None:
        live, model = self._live, self._model(model)
        live[model] = live.get(model, 0) - 1

    def request_body(self, path: str, n: int) -> None:
        self._body(path if path in PATHS else OTHER).observe(n)

    def bytes_relayed(self, model: str, direction: str, n: int) -> None:
        self._bytes_tally.add((self._model(model), direction), n)

    def client_gone(self, model: str) -> None:
        self._client_gone(self._model(model)).inc()

    def client_timeout(self, kind: str) -> None:
        self._client_timeouts(kind).inc()

    def client_connections(self, n: int) -> None:
        self._connections.set(n)

    def connection_refused(self) -> None:
        self._connections_refused.inc()

    # -- upstream --

    def upstream_error(self, model: str, endpoint_id: str, kind: str) -> None:
        self._upstream_errors(self._model(model), endpoint_id, kind).inc()

    def retried(self, model: str) -> None:
        self._retries(self._model(model)).inc()

    def pool_connections(self, endpoint_id: str, idle: int, active: int) -> None:
        self._pool(endpoint_id, "idle").set(idle)
        self._pool(endpoint_id, "active").set(active)

    # -- admission --

    def queue_depth(self, model: str, n: int) -> None:
        self._queue_depth(self._model(model)).set(n)

    def queue_wait(self, model: str, seconds: float) -> None:
        self._queue_wait(self._model(model)).observe(seconds)

    def admission_rejected(self, model: str, reason: str) -> None:
        self._rejected(UNKNOWN_MODEL if reason == "unknown_model" else self._model(model), reason).inc()

    # -- scoring --

    def scored(self, model: str, decision: str) -> None:
        self._scored(self._model(model), decision).inc()

    # -- endpoints --

    def endpoint_state(self, endpoint_id: str, model: str, healthy: bool, inflight: int,
                       engine_running: float | None, engine_waiting: float | None,
                       kv_usage: float | None) -> None:
        """An endpoint's figures now; ``None`` removes that series, because the engine did not say."""
        model = self._model(model)
        self._healthy(endpoint_id, model).set(1 if healthy else 0)
        self._ep_inflight(endpoint_id, model).set(inflight)
        for family, value in ((self._ep_running, engine_running), (self._ep_waiting, engine_waiting),
                              (self._ep_kv, kv_usage)):
            if value is None:
                family.remove(endpoint_id, model)
            else:
                family(endpoint_id, model).set(value)
        healthy = bool(healthy)
        if self._health.get((endpoint_id, model)) != healthy:
            self._health[(endpoint_id, model)] = healthy
            self._count_endpoints()

    def endpoint_removed(self, endpoint_id: str, model: str) -> None:
        model = self._model(model)
        for family in (self._healthy, self._ep_inflight, self._ep_running, self._ep_waiting, self._ep_kv):
            family.remove(endpoint_id, model)
        # Its pool goes with it, unless another model still uses the endpoint.
        if not any(e == endpoint_id for e, m in self._health if m != model):
            self._pool.remove(endpoint_id, "idle")
            self._pool.remove(endpoint_id, "active")
        if self._health.pop((endpoint_id, model), None) is not None:
            self._count_endpoints()

    def _count_endpoints(self) -> None:
        healthy = sum(1 for ok in self._health.values() if ok)
        self._endpoints("healthy").set(healthy)
        self._endpoints("unhealthy").set(len(self._health) - healthy)

    # -- keys --

    def key_request(self, key_name: str, model: str) -> None:
        self._key_requests_tally.add((key_name, self._model(model)), 1)

    def key_tokens(self, key_name: str, kind: str, n: int) -> None:
        self._key_tokens_tally.add((key_name, kind), n)


class NullMetrics:
    """``RouterMetrics``'s methods, doing nothing: for a router run without metrics."""

    def refresh_with(self, refresh: Callable[[], None] | None) -> None:
        pass

    def set_models(self, names) -> None:
        pass

    def request_done(self, model: str, path: str, status: int, seconds: float,
                     ttft_seconds: float | None, prompt_tokens: int | None,
                     completion_tokens: int | None) -> None:
        pass

    def request_started(self, model: str) -> None:
        pass

    def request_finished(self, model: str) -> None:
        pass

    def request_body(self, path: str, n: int) -> None:
        pass

    def bytes_relayed(self, model: str, direction: str, n: int) -> None:
        pass

    def client_gone(self, model: str) -> None:
        pass

    def upstream_error(self, model: str, endpoint_id: str, kind: str) -> None:
        pass

    def client_timeout(self, kind: str) -> None:
        pass

    def client_connections(self, n: int) -> None:
        pass

    def connection_refused(self) -> None:
        pass

    def retried(self, model: str) -> None:
        pass

    def pool_connections(self, endpoint_id: str, idle: int, active: int) -> None:
        pass

    def queue_depth(self, model: str, n: int) -> None:
        pass

    def queue_wait(self, model: str, seconds: float) -> None:
        pass

    def admission_rejected(self, model: str, reason: str) -> None:
        pass

    def scored(self, model: str, decision: str) -> None:
        pass

    def endpoint_state(self, endpoint_id: str, model: str, healthy: bool, inflight: int,
                       engine_running: float | None, engine_waiting: float | None,
                       kv_usage: float | None) -> None:
        pass

    def endpoint_removed(self, endpoint_id: str, model: str) -> None:
        pass

    def key_request(self, key_name: str, model: str) -> None:
        pass

    def key_tokens(self, key_name: str, kind: str, n: int) -> None:
        pass
