"""What a router tells the control plane of its traffic: ``RouterLoad``, sent every second.

Every router — the server's own and each ``twistd llmgw-router`` worker —
reports the same record (``llmgw.cp.router.load`` over the hub; the server's
own router hands it over in-process).  The control plane sums the latest
report of each router:

- for scaling (``llmgw.control.demand``, ``llmgw.control.scaler``): per model,
  requests holding a slot, waiting in the admission queue and held for a
  cold start, how long since the last request arrived, and the engines' own
  waiting queues; per endpoint, requests in flight (a draining replica is
  stopped once every router says none is left on it);
- for the fleet's figures (``llmgw.control.series``): per model and per API
  key, counters since the router started, whose differences between two
  reports are the traffic of that second.

A router is an authenticated peer but its report is still a report: every
figure is bounded here, and the control plane holds a router's report only
until the next (or ``REPORT_LIFETIME_S`` when none comes).
"""

from __future__ import annotations

import attrs

from llmgw.wire import Text, field

#: Models, endpoints, keys one report names at most.
MANY = 10_000
#: A count of requests or tokens since a router started.
COUNT = 2**53
#: Requests in flight, queued or held in one router.
INFLIGHT = 1_000_000
#: The bucket edges of the time-to-first-token counts, in milliseconds; a last bucket counts the rest.
TTFT_BUCKETS_MS = (25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000)
#: How often a router reports, and how long the control plane keeps a report no newer one replaced.
REPORT_INTERVAL_S = 1.0
REPORT_LIFETIME_S = 5.0


@attrs.frozen
class ModelLoad:
    """One model's traffic in one router, now."""

    model: str = field(chars=1024)
    inflight: int = field(0, least=0, most=INFLIGHT)  # holding a slot on an endpoint
    queued: int = field(0, least=0, most=INFLIGHT)  # waiting in the admission queue
    held: int = field(0, least=0, most=INFLIGHT)  # held while the model starts on demand
    # Seconds since the last request for it arrived; None: none since the router started.
    idle_s: float | None = field(None, least=0, most=2**40)
    # The engines' own waiting queues (vLLM's num_requests_waiting), summed; None: no engine says.
    engine_waiting: int | None = field(None, least=0, most=INFLIGHT)


@attrs.frozen
class EndpointLoad:
    """Requests in flight on one endpoint (a replica id), in one router."""

    id: str = field(chars=1024)
    inflight: int = field(0, least=0, most=INFLIGHT)


@attrs.frozen
class ModelCounts:
    """One model's counters in one router since it started: a restart starts them at zero again."""

    model: str = field(chars=1024)
    requests: int = field(0, least=0, most=COUNT)
    prompt_tokens: int = field(0, least=0, most=COUNT)
    completion_tokens: int = field(0, least=0, most=COUNT)
    # Answers that were errors, by class: "4xx", "429", "5xx", "503", "upstream".
    errors: dict[str, int] = field(factory=dict, chars=32, items=16)
    # Time to first byte of the answer, counted per TTFT_BUCKETS_MS bucket (len + 1 counts).
    ttft_ms: list[int] = field(factory=list, least=0, most=COUNT, items=len(TTFT_BUCKETS_MS) + 1)


@attrs.frozen
class KeyCounts:
    """One API key's counters in one router since it started (by the key's name, never its secret)."""

    key: str = field(chars=256)
    requests: int = field(0, least=0, most=COUNT)
    tokens: int = field(0, least=0, most=COUNT)


@attrs.frozen
class RouterLoad:
    """``llmgw.cp.router.load``: one router's report."""

    # Which router: stable for the life of its process (host and pid, or "server" for the server's own).
    router: str = field(chars=256)
    models: list[ModelLoad] = field(factory=list, items=MANY)
    endpoints: list[EndpointLoad] = field(factory=list, items=MANY)
    counts: list[ModelCounts] = field(factory=list, items=MANY)
    keys: list[KeyCounts] = field(factory=list, items=MANY)
    # True when sent at once because a request is held for a model with none ready (a cold start).
    urgent: bool = False
