"""The router's decisions for one request: may it come in, where does it go, and what then.

``Dispatcher`` holds the endpoint table (fed by the control plane or a static
list) and answers ``admit(model, request)`` with a ``Lease`` on one endpoint,
in this order, each step refusing with the error the HTTP path turns into a
status:

1. keys (when ``router.keys`` has any): 401 no or wrong key, 403 a model the
   key may not use, 429 over the key's requests or tokens per minute;
2. the model: 404 if nothing by that name is served or known;
3. its endpoints: 503 with Retry-After when none is ready, with the control
   plane's reason (``set_unavailable``), the endpoints' failures, or, for any
   model before a router has its first table, ``set_pending``'s; a model the
   table names elastic and gives no endpoint is held instead (``coldstart.py``)
   until one comes;
4. admission (``admission.py``): a free slot, or a place in the queue, or 429;
5. scoring (``scoring.py``) picks the endpoint among those with a free slot.

The HTTP path then calls ``lease.release(outcome)`` exactly once it is done
(more calls are ignored), ``lease.usage(...)`` when the engine reported
tokens, and ``lease.retry()`` when the request failed before its first byte
reached the client.

Health: an endpoint whose requests fail upstream twice in a row is taken out
of rotation for a cool-down of 5 s, doubling (to at most 60 s) each time it
fails again straight after; then it gets requests again, and one answer
(``ok`` or ``error``) restores it fully.  A new endpoint table keeps the
state of every endpoint whose id and address did not change; one at a new
address is a new engine and starts healthy.

Pure and clock-driven: no sockets, no global reactor; tests drive it with
``twisted.internet.task.Clock``.
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping
from urllib.parse import urlsplit

import attrs
from twisted.internet import defer
from twisted.internet.interfaces import IDelayedCall, IReactorTime

from llmgw.config.routing import RouterSettings
from llmgw.router import errors
from llmgw.router.admission import ModelQueue, capacity, free
from llmgw.router.coldstart import ColdStarts
from llmgw.router.fairqueue import BAND, Flow
from llmgw.router.keys import KeyRing
from llmgw.router.lease import OUTCOMES, Attempt, Lease
from llmgw.router.scoring import (
    DEFAULT_LOAD_FACTOR,
    DEFAULT_PREFIX_CHARS,
    DEFAULT_VNODES,
    Endpoint,
    make_policy,
)
from llmgw.views import ColdStart, EndpointEntry

__all__ = [
    "COOLDOWN_S",
    "Dispatcher",
    "Endpoint",
    "FAILURES_BEFORE_UNHEALTHY",
    "Lease",
    "MAX_COOLDOWN_S",
    "OUTCOMES",
    "RequestInfo",
]

FAILURES_BEFORE_UNHEALTHY = 2
COOLDOWN_S = 5.0
MAX_COOLDOWN_S = 60.0


@attrs.frozen
class RequestInfo:
    """What the router read of a client's request, for the dispatcher to admit and place it.

    The HTTP path (``server.py``) builds one per request with every field;
    tests name only the fields they care about.
    """

    path: str = "/v1/chat/completions"
    model: str = ""
    stream: bool = False
    body: dict = attrs.Factory(dict)
    api_key: str | None = None
    # The prompt's leading text (chat: the messages' contents in order;
    # completions: the prompt; embeddings: the input), at most 2,048 characters.
    prefix: str = ""
    # The request's id (``llmgw.router.requestid``): the client's X-Request-Id, or one the router made.
    request_id: str = ""
    # The client's address: whose share a request is on a router without keys (``fairqueue``).
    client: str = ""


def _held(queue: ModelQueue, flow: str) -> int:
    kept = queue.fair.flows.get(flow)
    return 0 if kept is None else kept.held


def _address(entry: EndpointEntry) -> tuple[str, int]:
    parts = urlsplit(entry.url)
    try:
        port = parts.port
    except ValueError:
        port = -1
    if parts.scheme != "http" or not parts.hostname or (port is not None and port < 0):
        raise ValueError(f"endpoint {entry.id}: {entry.url!r} is not an http://host:port URL")
    return parts.hostname, port if port is not None else 80


class Dispatcher:
    """Admission, scoring, keys and endpoint health for every model the router serves."""

    def __init__(
        self,
        clock: IReactorTime,
        config: RouterSettings,
        metrics=None,
        *,
        prefix_chars: int = DEFAULT_PREFIX_CHARS,
        load_factor: float = DEFAULT_LOAD_FACTOR,
        vnodes: int = DEFAULT_VNODES,
    ):
        self._clock = clock
        self._metrics = metrics
        # Queue figures go to metrics that can take them (RouterMetrics does).
        self._queue_depth = getattr(metrics, "queue_depth", None)
        self._queue_wait = getattr(metrics, "queue_wait", None)
        self._key_request = getattr(metrics, "key_request", None)
        self._key_tokens = getattr(metrics, "key_tokens", None)
        self._fair = getattr(metrics, "fair", None)
        self._policy_options = {"prefix_chars": prefix_chars, "load_factor": load_factor, "vnodes": vnodes}
        self._table: dict[str, Endpoint] = {}
        self._by_model: dict[str, list[Endpoint]] = {}
        self._queues: dict[str, ModelQueue[Attempt]] = {}
        self._unavailable: dict[str, str] = {}
        self._pending: str | None = None
        self._revivals: dict[str, IDelayedCall] = {}
        self._keys = KeyRing((), clock)
        self._config = config
        self._policy = make_policy(config.scoring, **self._policy_options)
        # Held requests of models that start on demand; its first_held is the router's urgent report.
        self.cold: ColdStarts[Attempt] = ColdStarts(clock, getattr(metrics, "elastic", None))
        self.cold.why = lambda model: self._unavailable.get(model) or "no replica is running"
        # When the last request for each model arrived, and endpoints gone from the table with
        # requests still on them: what the load report reads (loadreport.py).
        self.arrived: dict[str, float] = {}
        self.departed: set[Endpoint] = set()
        # Called with the model whenever a request starts waiting for a slot (``stall.StallWatch``).
        self.waited: Callable[[str], None] | None = None
        self.reconfigure(config)

    # -- configuration and the endpoint table ---------------------------------

    def reconfigure(self, config: RouterSettings) -> None:
        """Take a reloaded ``router:`` section; rate-limit state survives for unchanged keys."""
        keys = KeyRing(config.keys, self._clock)
        keys.carry_over(self._keys)
        self._keys = keys
        if config.scoring != self._config.scoring:
            self._policy = make_policy(config.scoring, **self._policy_options)
        self._config = config
        self._limit = config.admission.max_inflight_per_endpoint
        for queue in self._queues.values():
            queue.limits = config.admission
        self._pump_all()

    @property
    def config(self) -> RouterSettings:
        return self._config

    @property
    def open_api(self) -> bool:
        """No keys are configured: anyone who reaches the listener may call it."""
        return not self._config.keys

    def set_endpoints(self, entries: Iterable[EndpointEntry], unavailable: Mapping[str, str] | None = None,
                      elastic: Mapping[str, ColdStart] | None = None) -> None:
        """Replace the endpoint table; *unavailable*, if given, replaces every model's 503 reason, *elastic* the
        models that start on demand.

        An endpoint whose id, model and address are unchanged keeps its state
        (requests in flight, failures, cool-down).  Waiters of a model left with
        no endpoint at all fail with ``NoReadyEndpoint`` now rather than at
        their timeout.  Requests held for a model that now has endpoints go
        through in arrival order; those of a model no longer elastic fail now.
        """
        table: dict[str, Endpoint] = {}
        kept: list[tuple[Endpoint, str | None]] = []
        for entry in entries:
            if entry.id in table:
                raise ValueError(f"endpoint id {entry.id!r} appears twice in the table")
            host, port = _address(entry)
            old = self._table.get(entry.id)
            if old is not None and (old.model, old.host, old.port) == (entry.model, host, port):
                kept.append((old, entry.node_id))
                table[entry.id] = old
            else:
                table[entry.id] = Endpoint(entry.id, entry.model, host, port, entry.node_id)
        # Nothing changes until the whole table has been read: a bad one is refused whole.
        for endpoint, node_id in kept:
            endpoint.node_id = node_id
        for ident in [i for i in self._revivals if table.get(i) is not self._table.get(i)]:
            call = self._revivals.pop(ident)
            if call.active():
                call.cancel()
        by_model: dict[str, list[Endpoint]] = {}
        for endpoint in sorted(table.values(), key=lambda e: e.id):
            by_model.setdefault(endpoint.model, []).append(endpoint)
        self.departed.update(e for i, e in self._table.items() if e.inflight and table.get(i) is not e)
        self._table = table
        self._by_model = by_model
        if unavailable is not None:
            self._unavailable = dict(unavailable)
        cold = self.cold
        if elastic is not None:
            cold.set_policies(elastic)
        self.arrived = {m: t for m, t in self.arrived.items()
                        if m in by_model or m in cold.policies or m in self._unavailable}
        for model, queue in self._queues.items():
            if model not in by_model and len(queue):
                queue.fail_all(lambda: self._not_ready(model))
        for model in cold.models():
            if model in by_model:
                cold.release(model, lambda a: self._grant(a, frozenset()), self._enqueue_held)
            elif model not in cold.policies:
                cold.fail(model, lambda: self._not_ready(model))
        self._pump_all()

    def _enqueue_held(self, attempt: Attempt) -> defer.Deferred[Lease]:
        # As a retry: ahead of every request that came after it, and not refused by a full queue.
        return self._wait(attempt, frozenset(), True)

    def set_unavailable(self, model: str, reason: str | None) -> None:
        """Why *model* has no ready replica (placement's words), shown in its 503; ``None`` forgets it."""
        if reason is None:
            self._unavailable.pop(model, None)
        else:
            self._unavailable[model] = reason

    def set_pending(self, reason: str | None) -> None:
        """Every model neither served nor named by ``set_unavailable`` is not ready for *reason* (503), not unknown.

        For a router that cannot yet tell an unknown model from one still
        starting (it has no table); ``None`` makes such a model unknown (404) again.
        """
        self._pending = reason

    def models(self) -> list[str]:
        """Models with at least one healthy endpoint, or asleep until asked for, sorted: what ``GET /v1/models`` lists."""
        awake = {m for m, eps in self._by_model.items() if any(e.healthy for e in eps)}
        return sorted(awake.union(self.cold.policies))

    def endpoints(self, model: str | None = None) -> list[Endpoint]:
        """The table (or one model's part of it), sorted by id; read these, do not change them."""
        if model is not None:
            return list(self._by_model.get(model, ()))
        return [e for eps in self._by_model.values() for e in eps]

    def queue_depth(self, model: str) -> int:
        """Requests of *model* waiting for a slot, retries included."""
        queue = self._queues.get(model)
        return 0 if queue is None else len(queue)

    # -- admitting a request --------------------------------------------------

    def admit(self, model: str, request: RequestInfo) -> defer.Deferred[Lease]:
        """A lease on an endpoint of *model* for *request*, or a failure the HTTP path maps to a status."""
        try:
            key = None
            if self._config.keys:
                keys = self._keys
                key = keys.authenticate(request.api_key)
                if self._key_request is not None:
                    self._key_request(key.name, model)
                keys.check_model(key, model)
                keys.charge_request(key)
            if model not in self._by_model and model in self.cold.policies:
                self.arrived[model] = self._clock.seconds()
                return self.cold.hold(model, Attempt(model, request, key))
            self._serving(model)
            self.arrived[model] = self._clock.seconds()
            attempt = Attempt(model, request, key)
            queue = self._queue(model)
            if not queue.depth:
                cap = None if key is None else key.max_inflight
                if cap is None or _held(queue, attempt.flow) < cap:
                    lease = self._grant(attempt, frozenset())
                    if lease is not None:
                        return defer.succeed(lease)
            return self._wait(attempt, frozenset(), False)
        except Exception:
            return defer.fail()

    def _serving(self, model: str) -> list[Endpoint]:
        endpoints = self._by_model.get(model)
        if not endpoints:
            if model in self._unavailable or self._pending is not None:
                raise self._not_ready(model)
            served = ", ".join(self.models()) or "none yet"
            raise errors.UnknownModel(
                f"no model named {model!r} is served here; served: {served} (GET /v1/models lists them)"
            )
        for endpoint in endpoints:
            if endpoint.healthy:
                return endpoints
        raise self._not_ready(model)

    def _not_ready(self, model: str) -> Exception:
        endpoints = self._by_model.get(model)
        after = 1.0
        if endpoints:
            now = self._clock.seconds()
            soonest = min(e.unhealthy_until if e.unhealthy_until is not None else now for e in endpoints)
            ids = ", ".join(e.id for e in endpoints)
            after = max(0.0, soonest - now)
            why = f"every endpoint is failing ({ids}); the next is tried again in {after:.0f} s"
        else:
            why = self._unavailable.get(model) or self._pending or "no replica is running"
        return errors.NoReadyEndpoint(f"model {model!r} has no ready replica: {why}", retry_after_s=after)

    def _queue(self, model: str) -> ModelQueue[Attempt]:
        queue = self._queues.get(model)
        if queue is None:
            queue = self._queues[model] = ModelQueue(self._clock, model, self._config.admission)
            queue.slots = lambda: capacity(self._by_model.get(model, ()), self._limit)
            if self._queue_depth is not None:
                report = self._queue_depth
                queue.changed = lambda n: report(model, n)
        return queue

    def _flow(self, attempt: Attempt) -> Flow:
        key = attempt.key
        band, cap = (0, None) if key is None else (BAND[key.priority], key.max_inflight)
        return self._queue(attempt.model).fair.flow(attempt.flow, band, cap)

    def _wait(self, attempt: Attempt, exclude: frozenset[str], retry: bool) -> defer.Deferred[Lease]:
        model = attempt.model
        attempt.queued_at = self._clock.seconds()
        d = self._queue(model).wait(attempt, self._flow(attempt), exclude, retry)
        if self.waited is not None:
            self.waited(model)
        # A slot may be free that the flows ahead could not take (at their cap).
        self._pump(model)
        return d

    def _grant(self, attempt: Attempt, exclude: frozenset[str]) -> Lease | None:
        """A lease on the endpoint scoring picks among the free ones, or ``None`` if none is free."""
        model = attempt.model
        endpoints = self._by_model.get(model)
        if not endpoints:
            return None
        candidates = free(endpoints, self._limit, exclude)
        if not candidates:
            return None
        endpoint, decision = self._policy.pick(model, endpoints, candidates, attempt.request.prefix)
        now = self._clock.seconds()
        queued_s = 0.0
        if attempt.queued_at is not None:
            queued_s = now - attempt.queued_at
            attempt.queued_at = None
            if self._queue_wait is not None:
                self._queue_wait(model, queued_s)
            if attempt.key is not None and self._fair is not None:
                self._fair.key_queue_wait(attempt.key.name, queued_s)
        if self._metrics is not None:
            self._metrics.scored(model, decision)
        endpoint.inflight += 1
        attempt.tried.add(endpoint.id)
        flow = self._flow(attempt)
        flow.held += 1
        self._queues[model].fair.served(flow)
        return Lease(self, attempt, endpoint, now, queued_s, flow)

    def _retry(self, attempt: Attempt) -> defer.Deferred[Lease] | None:
        untried = [e for e in self._by_model.get(attempt.model, ()) if e.healthy and e.id not in attempt.tried]
        if not untried:
            return None
        exclude = frozenset(attempt.tried)
        lease = self._grant(attempt, exclude)
        if lease is not None:
            return defer.succeed(lease)
        return self._wait(attempt, exclude, True)

    def _pump(self, model: str) -> None:
        queue = self._queues.get(model)
        if queue is None or not len(queue):
            return
        endpoints = self._by_model.get(model, ())
        limit = self._limit
        queue.serve(
            lambda: any(e.healthy and e.inflight < limit for e in endpoints),
            self._grant,
        )

    def _pump_all(self) -> None:
        for model in list(self._queues):
            self._pump(model)

    # -- outcomes and health --------------------------------------------------

    def _released(self, lease: Lease, outcome: str) -> None:
        endpoint = lease.endpoint
        endpoint.inflight -= 1
        if self.departed and not endpoint.inflight:
            self.departed.discard(endpoint)
        now = self._clock.seconds()
        if outcome == "upstream_failed":
            self._failed(endpoint, now)
        elif outcome != "client_gone":
            endpoint.consecutive_failures = 0
            endpoint.cooldown_s = 0.0
            if not endpoint.healthy:
                self._revive(endpoint)
        flow = lease.flow
        flow.held -= 1
        queue = self._queues.get(lease.model)
        if queue is not None:
            if not flow.held:
                queue.fair.forget(flow)
            queue.observe(now - lease.started_at)
        self._pump(lease.model)

    def _failed(self, endpoint: Endpoint, now: float) -> None:
        endpoint.consecutive_failures += 1
        if not endpoint.healthy or endpoint.consecutive_failures < FAILURES_BEFORE_UNHEALTHY:
            return
        endpoint.healthy = False
        # Failing again straight after a cool-down doubles the next one; an
        # answer in between (cooldown_s back to 0) starts over at COOLDOWN_S.
        endpoint.cooldown_s = min(MAX_COOLDOWN_S, endpoint.cooldown_s * 2) if endpoint.cooldown_s else COOLDOWN_S
        endpoint.unhealthy_until = now + endpoint.cooldown_s
        if self._table.get(endpoint.id) is endpoint:
            self._revivals[endpoint.id] = self._clock.callLater(endpoint.cooldown_s, self._revive, endpoint)

    def _revive(self, endpoint: Endpoint) -> None:
        call = self._revivals.pop(endpoint.id, None)
        if call is not None and call.active():
            call.cancel()
        if endpoint.healthy or self._table.get(endpoint.id) is not endpoint:
            return
        endpoint.healthy = True
        endpoint.unhealthy_until = None
        if endpoint.cooldown_s:
            # On probation: one more failure takes it out again, for longer.
            endpoint.consecutive_failures = FAILURES_BEFORE_UNHEALTHY - 1
        self._pump(endpoint.model)
