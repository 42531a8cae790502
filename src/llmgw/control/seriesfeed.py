"""What fills the last hour's figures (``llmgw.control.series``), and ``llmgw.cp.figures``, which answers them.

Traffic comes from every router's report (``traffic.RouterLoad``, one of
``ControlSession.load_listeners``).  Its counters are cumulative since that
router started, so the feed keeps each router's last report and adds the
difference to the open bucket, summed across routers:

- a router's first report is its baseline and adds nothing: after a server
  restart, routers hours old would otherwise put their hours in one bucket;
- a model or key a known router names for the first time adds its counts
  from 0: it is that second's traffic;
- a counter that went down is a restarted router, and its new value is the
  difference from 0;
- a router silent for ``traffic.REPORT_LIFETIME_S`` is forgotten (its
  queue no longer counts); if it speaks again, it is a first report.

The queue (requests queued for admission plus those held for a cold start)
is sampled as each bucket closes: the sum of every live router's last figure.

Nodes' figures come from the fleet's node events (``ControlSession.event_listeners``),
not from reading the fleet each bucket: the fleet builds a node's view only
when a heartbeat is news (``llmgw.control.news``: a figure moved by
``fleet.node_figures_change``, or ``fleet.node_event_interval_s`` passed),
so the feed costs nothing per heartbeat, while reading every node's view
each bucket would build 10,000 views every ten seconds.  The figures are
therefore those of the node's last news, within that threshold.  They are
the node's claims: a percentage outside 0–100, memory in use above the
total, or a card that did not say, makes the figure None, never 0; a node
that is not ready has None, as its last figures are stale.
"""

from __future__ import annotations

from autobahn.wamp.exception import ApplicationError
from twisted.logger import Logger

from llmgw.control.series import ERROR_CLASSES, ModelBucket, Rolling
from llmgw.history import PAGE_MOST, Scope
from llmgw.link import uris
from llmgw.states import NodeState
from llmgw.traffic import REPORT_LIFETIME_S, TTFT_BUCKETS_MS, KeyCounts, ModelCounts, RouterLoad
from llmgw.views import EventKind, NodeChange, NodeEvent, NodeView
from llmgw.wire import to_wire

#: A subject's name in a ``llmgw.cp.figures`` question, at most (as the records hold it).
SUBJECT_CHARS = 1024
_TTFT_LEN = len(TTFT_BUCKETS_MS) + 1
_UNKNOWN = (None, None, None)


log = Logger()

def _more(new: int, old: int) -> int:
    """What a cumulative counter added: its growth (one that went down is refused whole by ``_went_down``)."""
    return new - old if new >= old else 0


def _went_down(heard: _Heard, old: _Heard) -> bool:
    """Whether any counter of *heard* is below *old*'s: never so within one router's session."""
    for model, new in heard.counts.items():
        before = old.counts.get(model)
        if before is not None and (new.requests < before.requests or new.prompt_tokens < before.prompt_tokens
                                   or new.completion_tokens < before.completion_tokens
                                   or any(n < before.errors.get(c, 0) for c, n in new.errors.items())
                                   or any(n < b for n, b in zip(new.ttft_ms, before.ttft_ms))):
            return True
    for key, new_key in heard.keys.items():
        before_key = old.keys.get(key)
        if before_key is not None and (new_key.requests < before_key.requests or new_key.tokens < before_key.tokens):
            return True
    return False


class _Heard:
    """One router's last report, by model and key, and when it came."""

    __slots__ = ("at", "counts", "keys", "queues")

    def __init__(self, at: float, report: RouterLoad):
        self.at = at
        self.counts: dict[str, ModelCounts] = {c.model: c for c in report.counts}
        self.keys: dict[str, KeyCounts] = {k.key: k for k in report.keys}
        self.queues: dict[str, int] = {m.model: m.queued + m.held for m in report.models}


def add_model(into: ModelBucket, new: ModelCounts, old: ModelCounts | None) -> None:
    """Add what *new* counted since *old* (None: from 0) to the open bucket's figures of the model."""
    if old is None:
        old = ModelCounts(new.model)
    into.requests += _more(new.requests, old.requests)
    into.tokens_in += _more(new.prompt_tokens, old.prompt_tokens)
    into.tokens_out += _more(new.completion_tokens, old.completion_tokens)
    for cls, n in new.errors.items():
        more = _more(n, old.errors.get(cls, 0))
        into.errors += more
        if more and cls in ERROR_CLASSES:
            into.by_class[cls] = into.by_class.get(cls, 0) + more
    # A list of another length is not this version's buckets: its percentiles are unknown, its rest counted.
    if len(new.ttft_ms) == _TTFT_LEN:
        before = old.ttft_ms if len(old.ttft_ms) == _TTFT_LEN else [0] * _TTFT_LEN
        ttft = into.ttft
        for i in range(_TTFT_LEN):
            ttft[i] += _more(new.ttft_ms[i], before[i])


def node_figures(view: NodeView) -> tuple[float | None, float | None, float | None]:
    """A node's (memory used %, GPU utilisation %, GPU memory used %), each None where its claims do not hold."""
    if view.state != NodeState.READY:
        return _UNKNOWN
    memory = None
    total, available = view.memory_total_bytes, view.memory_available_bytes
    if total is not None and available is not None and total > 0 and 0 <= available <= total:
        memory = 100.0 * (total - available) / total
    util = gpu_memory = None
    cards = view.gpus or []
    if cards:
        utils = [c.utilization_pct for c in cards]
        if all(u is not None and 0 <= u <= 100 for u in utils):
            util = sum(utils) / len(utils)
        used = [c.memory_used_bytes for c in cards]
        totals = [c.memory_total_bytes for c in cards]
        if all(u is not None and t is not None and t > 0 and 0 <= u <= t for u, t in zip(used, totals)):
            gpu_memory = 100.0 * sum(used) / sum(totals)
    return memory, util, gpu_memory


class SeriesFeed:
    """Routers' reports and nodes' news into *rolling*; ``register`` adds ``llmgw.cp.figures`` to the session."""

    def __init__(self, rolling: Rolling):
        self.rolling = rolling
        self._routers: dict[str, _Heard] = {}
        self._distrusted: set[str] = set()  # routers whose counters went down: bounded as _routers is
        self._nodes: dict[str, tuple[float | None, float | None, float | None]] = {}
        rolling.queue_sampler = self._queues
        rolling.node_sampler = lambda: self._nodes

    # -- ControlSession.load_listeners -------------------------------------------------------

    def load(self, report: RouterLoad, router_key: str, now: float) -> None:
        rolling = self.rolling
        rolling.advance(now)
        self._forget_silent(now)
        old = self._routers.get(router_key)
        heard = self._routers[router_key] = _Heard(now, report)
        if old is None or router_key in self._distrusted:
            return
        if _went_down(heard, old):
            # Within one session a counter never goes down: this router's counters are not believed again
            # until it reconnects (a new session is a new router, whose first report is a baseline).
            self._distrusted.add(router_key)
            log.warn("router {key}'s counters went down within one session; its traffic is left out of the "
                     "figures until it reconnects", key=router_key)
            return
        for model, counts in heard.counts.items():
            add_model(rolling.model(now, model), counts, old.counts.get(model))
        for key, counts in heard.keys.items():
            before = old.keys.get(key)
            if before is None:
                rolling.add_key(now, key, counts.requests, counts.tokens)
            else:
                rolling.add_key(now, key, _more(counts.requests, before.requests), _more(counts.tokens, before.tokens))

    def _forget_silent(self, now: float) -> None:
        silent = [key for key, heard in self._routers.items() if now - heard.at > REPORT_LIFETIME_S]
        for key in silent:
            del self._routers[key]
            self._distrusted.discard(key)

    def _queues(self) -> dict[str, int]:
        self._forget_silent(self.rolling.clock.seconds())
        total: dict[str, int] = {}
        for heard in self._routers.values():
            for model, queue in heard.queues.items():
                total[model] = total.get(model, 0) + queue
        return total

    # -- ControlSession.event_listeners ------------------------------------------------------

    def event(self, kind: EventKind, ident: str, event) -> None:
        if kind is not EventKind.NODE or not isinstance(event, NodeEvent):
            return
        if event.change is NodeChange.FORGOTTEN:
            self._nodes.pop(event.node.id, None)
        else:
            self._nodes[event.node.id] = node_figures(event.node)

    # -- llmgw.cp.figures ---------------------------------------------------------------------

    async def register(self, session) -> None:
        await session.register(self.figures, uris.CP_FIGURES)

    def figures(self, scope=None, subject=None, buckets=None, limit=None) -> dict:
        """``history.Figures``: every series, or *scope*'s, or one *subject*'s; the newest *buckets*; *limit* series."""
        if scope is not None:
            try:
                scope = Scope(scope)
            except ValueError:
                raise _refused(f"scope must be one of {', '.join(s.value for s in Scope)}, or none for all") from None
        if subject is not None and (not isinstance(subject, str) or len(subject) > SUBJECT_CHARS):
            raise _refused(f"subject must be a name of at most {SUBJECT_CHARS} characters")
        most = self.rolling.buckets
        if buckets is not None and (type(buckets) is not int or not 1 <= buckets <= most):
            raise _refused(f"buckets must be a whole number from 1 to {most} (history.series_buckets)")
        if limit is not None and (type(limit) is not int or not 1 <= limit <= PAGE_MOST):
            raise _refused(f"limit must be a whole number from 1 to {PAGE_MOST}")
        return to_wire(self.rolling.figures(scope, subject, buckets, PAGE_MOST if limit is None else limit))


def _refused(words: str) -> ApplicationError:
    return ApplicationError(uris.ERROR_INVALID_ARGUMENT, f"{uris.CP_FIGURES}: {words}")
