"""Which endpoint of a model takes the next request: the three policies of ``router.scoring``.

Scoring is pure: a policy gets the endpoints that may take a request now
(healthy, under their in-flight limit, not already tried for this request),
and for prefix affinity the model's whole ring as well, and names one of them
with the kind of decision it made (``affinity_hit``, ``affinity_spill``,
``least_outstanding``, ``engine_load``), which the dispatcher counts for
metrics.  Admission has already made sure there is at least one candidate.

``least-outstanding``
    The fewest requests in flight from this router; ties go round robin, so
    two idle endpoints share the load instead of the first taking it all.
``prefix-affinity``
    Consistent hashing with bounded loads (Mirrokni, Thorup and Zadimoghaddam,
    2018): the first ``prefix_chars`` characters of the prompt are hashed onto
    a ring of endpoints (``vnodes`` points each); the request goes to the first
    endpoint clockwise whose load, counting this request, stays within
    ``ceil(load_factor × average load)``.  A repeated prefix lands on the same
    engine, whose KV cache already holds it, until that engine carries more
    than its share; then it spills to the next one on the ring.  A request with
    no prefix has nothing to be warm for and goes least-outstanding.
``engine-load``
    The engines' own figures from their ``/metrics`` (``EnginePoller``):
    lowest ``(waiting, running, kv_usage, in flight)``.  A figure that is not
    reported is unknown, not zero, so a figure is compared only when every
    candidate reports it; with none, this is least-outstanding.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from typing import Protocol, Sequence

import attrs

LEAST_OUTSTANDING = "least_outstanding"
AFFINITY_HIT = "affinity_hit"
AFFINITY_SPILL = "affinity_spill"
ENGINE_LOAD = "engine_load"
#: The policy that reads the engines' /metrics: the router polls them only under it.
ENGINE_LOAD_POLICY = "engine-load"
DECISIONS = (AFFINITY_HIT, AFFINITY_SPILL, LEAST_OUTSTANDING, ENGINE_LOAD)

DEFAULT_PREFIX_CHARS = 256
DEFAULT_LOAD_FACTOR = 1.25
DEFAULT_VNODES = 64


@attrs.define(eq=False)
class Endpoint:
    """One engine serving ``model``, as the router sees it; the dispatcher owns and mutates it.

    ``inflight`` counts this router's requests on it.  The ``engine_*`` figures
    and ``kv_usage`` (0 to 1) are what the engine last said on its /metrics;
    ``None`` is *not reported*, never idle.
    """

    id: str
    model: str
    host: str
    port: int
    node_id: str | None = None
    inflight: int = 0
    healthy: bool = True
    consecutive_failures: int = 0
    engine_running: float | None = None
    engine_waiting: float | None = None
    kv_usage: float | None = None
    # ``inflight`` when the engine figures above were read: requests sent or
    # finished since then are not in them yet (see ``EngineLoad``).
    engine_inflight_at_report: int | None = None
    # Health bookkeeping (dispatch.py): when a failing endpoint is tried again,
    # and how long the next cool-down is if that try fails too.
    unhealthy_until: float | None = None
    cooldown_s: float = 0.0

    @property
    def url(self) -> str:
        """``http://host:port``, the base the HTTP path and the poller append paths to."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


class Policy(Protocol):
    def pick(
        self, model: str, ring: Sequence[Endpoint], candidates: Sequence[Endpoint], prefix: str
    ) -> tuple[Endpoint, str]:
        """One of *candidates* (never empty) and the decision's kind."""


class LeastOutstanding:
    """Fewest in flight; round robin among the endpoints tied for fewest."""

    def __init__(self) -> None:
        self._turn: dict[str, int] = {}

    def pick(
        self, model: str, ring: Sequence[Endpoint], candidates: Sequence[Endpoint], prefix: str
    ) -> tuple[Endpoint, str]:
        return self.least(model, candidates), LEAST_OUTSTANDING

    def least(self, model: str, candidates: Sequence[Endpoint]) -> Endpoint:
        if len(candidates) == 1:
            return candidates[0]
        low = min(e.inflight for e in candidates)
        tied = [e for e in candidates if e.inflight == low]
        return self.rotate(model, tied)

    def rotate(self, model: str, tied: Sequence[Endpoint]) -> Endpoint:
        """The next of *tied* in turn; the turn is per model, so models do not skew each other."""
        if len(tied) == 1:
            return tied[0]
        turn = self._turn.get(model, 0)
        self._turn[model] = turn + 1
        return tied[turn % len(tied)]


def _point(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big")


class Ring:
    """Endpoint ids on a hash ring, ``vnodes`` points each; the same ids always make the same ring."""

    def __init__(self, ids: Sequence[str], vnodes: int = DEFAULT_VNODES):
        points = sorted((_point(f"{ident}#{i}"), ident) for ident in ids for i in range(vnodes))
        self._hashes = [h for h, _ in points]
        self._owners = [ident for _, ident in points]
        self.ids = tuple(ids)

    def walk(self, key: str):
        """Endpoint ids clockwise from *key*'s point, each once; the first is *key*'s home."""
        n = len(self._owners)
        if not n:
            return
        start = bisect.bisect(self._hashes, _point(key))
        seen: set[str] = set()
        for i in range(n):
            ident = self._owners[(start + i) % n]
            if ident not in seen:
                seen.add(ident)
                yield ident
                if len(seen) == len(self.ids):
                    return


class PrefixAffinity:
    """Bounded-load consistent hashing of the prompt's first ``prefix_chars`` characters."""

    def __init__(
        self,
        prefix_chars: int = DEFAULT_PREFIX_CHARS,
        load_factor: float = DEFAULT_LOAD_FACTOR,
        vnodes: int = DEFAULT_VNODES,
    ):
        if prefix_chars < 1:
            raise ValueError(f"prefix_chars must be at least 1, not {prefix_chars}")
        if load_factor < 1:
            raise ValueError(f"load_factor must be at least 1 (1 is a perfect balance), not {load_factor}")
        self.prefix_chars = prefix_chars
        self.load_factor = load_factor
        self.vnodes = vnodes
        self._rings: dict[str, Ring] = {}
        self._fallback = LeastOutstanding()

    def ring(self, model: str, members: Sequence[Endpoint]) -> Ring:
        ids = tuple(sorted(e.id for e in members))
        ring = self._rings.get(model)
        if ring is None or ring.ids != ids:
            ring = self._rings[model] = Ring(ids, self.vnodes)
        return ring

    def bound(self, candidates: Sequence[Endpoint]) -> int:
        """The most requests one candidate may carry, this one included."""
        total = sum(e.inflight for e in candidates) + 1
        return math.ceil(self.load_factor * total / len(candidates))

    def pick(
        self, model: str, ring: Sequence[Endpoint], candidates: Sequence[Endpoint], prefix: str
    ) -> tuple[Endpoint, str]:
        if not prefix:
            return self._fallback.least(model, candidates), LEAST_OUTSTANDING
        # The ring holds every endpoint of the model, failing or full ones too,
        # so one endpoint leaving or coming back moves only its own keys.
        by_id = {e.id: e for e in candidates}
        bound = self.bound(candidates)
        home = True
        for ident in self.ring(model, ring).walk(prefix[: self.prefix_chars]):
            endpoint = by_id.get(ident)
            if endpoint is not None and endpoint.inflight + 1 <= bound:
                return endpoint, AFFINITY_HIT if home else AFFINITY_SPILL
            home = False
        # Only when a candidate is missing from the ring it was given; the bound
        # always admits the least loaded candidate.
        return self._fallback.least(model, candidates), LEAST_OUTSTANDING


def _waiting(endpoint: Endpoint) -> float | None:
    return endpoint.engine_waiting


def _kv_usage(endpoint: Endpoint) -> float | None:
    return endpoint.kv_usage


class EngineLoad:
    """Lowest engine-reported ``(waiting, running, kv_usage)``, then in flight, then round robin."""

    def __init__(self) -> None:
        self._fallback = LeastOutstanding()

    @staticmethod
    def running_now(endpoint: Endpoint) -> float | None:
        """The reported running count, moved by what this router sent or finished since the report.

        Figures are up to one poll old; without the correction every request
        between two polls would go to the endpoint that looked idlest at the
        last one.
        """
        if endpoint.engine_running is None:
            return None
        at_report = endpoint.engine_inflight_at_report
        since = 0 if at_report is None else endpoint.inflight - at_report
        return max(0.0, endpoint.engine_running + since)

    def pick(
        self, model: str, ring: Sequence[Endpoint], candidates: Sequence[Endpoint], prefix: str
    ) -> tuple[Endpoint, str]:
        if len(candidates) == 1:
            only = candidates[0]
            known = only.engine_waiting is not None or only.engine_running is not None or only.kv_usage is not None
            return only, ENGINE_LOAD if known else LEAST_OUTSTANDING
        used = []
        for read in (_waiting, self.running_now, _kv_usage):
            values = [read(e) for e in candidates]
            if all(v is not None for v in values):
                used.append(values)
        if not used:
            return self._fallback.least(model, candidates), LEAST_OUTSTANDING
        keys = [tuple(column[i] for column in used) + (e.inflight,) for i, e in enumerate(candidates)]
        low = min(keys)
        tied = [e for e, k in zip(candidates, keys) if k == low]
        return self._fallback.rotate(model, tied), ENGINE_LOAD


def make_policy(name: str, **options) -> Policy:
    """The policy that ``router.scoring`` names; *options* go to prefix affinity."""
    if name == "least-outstanding":
        return LeastOutstanding()
    if name == "prefix-affinity":
        return PrefixAffinity(**options)
    if name == ENGINE_LOAD_POLICY:
        return EngineLoad()
    raise ValueError(f"no scoring policy named {name!r}; use least-outstanding, prefix-affinity or engine-load")
