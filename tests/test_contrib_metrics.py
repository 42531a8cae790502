"""contrib's dashboard and rules apply each PromQL function to the type of series it is for.

A panel drew ``rate(llmgw_download_bytes[5m])``: a gauge of the bytes the
downloads in progress have fetched, which falls when one ends.  rate() reads
every fall as a counter reset and adds the whole value back: the graph showed
bursts of bytes that were never fetched.  rate(), irate(), increase() and
resets() are for counters (and a histogram's ``_bucket``/``_sum``/``_count``);
deriv(), delta(), idelta() and predict_linear() for gauges.  The types are the
code's: what the server's own collectors expose, through prometheus_client's
exposition, not what a page says.
"""

from __future__ import annotations

import re

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from twisted.internet.task import Clock

from llmgw.link.settings import LinkSettings
from llmgw.config.scale import Scale
from llmgw.control.collector import DownloadFailures, FleetCollector, WeightsCollector
from llmgw.control.demand import Demand
from llmgw.control.scalemetrics import ScaleCollector
from llmgw.control.scaler import Scaler
from llmgw.control.fleet import Fleet
from llmgw.link.hub import Hub
from llmgw.link.metrics import CertificateCollector, LinkCollector
from llmgw.records import Progress
from llmgw.router.metrics import RouterMetrics
from llmgw.states import ReplicaState
from llmgw.views import ReplicaView
from tests.admin.test_web import exercise
from tests.support.reportedfleet import gpu_node, shard
from tests.test_contrib import ROOT, dashboard_queries, rules

COUNTER_FUNCTIONS = ("rate", "irate", "increase", "resets")
GAUGE_FUNCTIONS = ("deriv", "delta", "idelta", "predict_linear")
# A function applied to a range over a plain selector: rate(name{...}[5m]).
CALL = re.compile(r"\b(" + "|".join(COUNTER_FUNCTIONS + GAUGE_FUNCTIONS) + r")\s*\(\s*([^\s(){}\[\],]*)")


@pytest.fixture
def exported(pki) -> dict[str, str]:
    """Every sample name the server's collectors expose, and its family's type (counter, gauge, histogram...).

    The collectors llmgw-server registers (process/server.py), each given
    something to report: a family with nothing to say is left out of a scrape.
    """
    clock = Clock()
    clock.advance(1_000)
    fleet = Fleet(clock, lambda kind, ident, event: None, unreachable_after=15, lost_after=60)
    fleet.register("gpu01", 1, gpu_node(), certificate_not_after=2_000_000_000.0)
    fleet.place("gpu01", shard("qwen", 0, "starting").spec)
    fleet.shard_status("gpu01", shard("qwen", 0, "ready"))
    fleet.download("gpu01", Progress(source="hf://org/model", file_name="model.safetensors", bytes_done=3,
                                     bytes_total=10))
    registry = CollectorRegistry()
    exercise(RouterMetrics(registry))
    registry.register(LinkCollector(Hub(clock, settings=LinkSettings()), {}))
    registry.register(CertificateCollector({"server": str(pki / "llmgw-server.crt"), "ca": str(pki / "ca.crt")}))
    registry.register(FleetCollector(fleet, clock, replicas=lambda: [ReplicaView("qwen", "qwen/0", ReplicaState.READY)]))
    registry.register(WeightsCollector(fleet, lambda: {"qwen": ("/srv/models/qwen", ())}))
    registry.register(DownloadFailures(fleet))
    scaler = Scaler(Demand())
    scaler.wanted("qwen", Scale(min=0, max=2), 0, 0, True, 1.0)
    registry.register(ScaleCollector(scaler))
    types = {}
    for line in generate_latest(registry).decode().splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            if kind == "histogram":
                types.update({name + suffix: "histogram" for suffix in ("_bucket", "_sum", "_count")})
            else:
                types[name] = kind
    return types


def calls() -> list[tuple[str, str, str]]:
    """(where, function, what it is applied to) for every rate-like call in contrib's rules and dashboard."""
    exprs = [(f"alerts.yml {r['alert']}", r["expr"]) for r in rules("alerts.yml")]
    exprs += [(f"recording.yml {r['record']}", r["expr"]) for r in rules("recording.yml")]
    exprs += [(f"dashboard panel {title!r}", expr) for title, expr in dashboard_queries()]
    return [(where, m.group(1), m.group(2)) for where, expr in exprs for m in CALL.finditer(expr)]


def wrong_types(found: list[tuple[str, str, str]], exported: dict[str, str]) -> list[str]:
    wrong = []
    for where, function, series in found:
        kind = exported.get(series)
        if kind is None:
            wrong.append(f"{where}: {function}({series}): not a family the server exports, or not a plain selector")
        elif function in COUNTER_FUNCTIONS and kind not in ("counter", "histogram"):
            wrong.append(f"{where}: {function}() of {series}, a {kind}: use deriv() or the value itself")
        elif function in GAUGE_FUNCTIONS and kind != "gauge":
            wrong.append(f"{where}: {function}() of {series}, a {kind}: use rate() or increase()")
    return wrong


def test_rate_and_increase_read_counters_and_deriv_reads_gauges(exported):
    found = calls()
    assert len(found) >= 10, found
    assert wrong_types(found, exported) == []


def test_the_check_refuses_rate_of_a_gauge_and_deriv_of_a_counter(exported):
    assert exported["llmgw_download_bytes"] == "gauge"
    assert exported["llmgw_router_requests_total"] == "counter"
    assert exported["llmgw_router_request_duration_seconds_bucket"] == "histogram"
    assert len(wrong_types([
        ("panel", "rate", "llmgw_download_bytes"), ("panel", "increase", "llmgw_router_queue_depth"),
        ("panel", "deriv", "llmgw_router_requests_total"), ("panel", "rate", "model:llmgw_router_requests:rate5m"),
        ("panel", "rate", "llmgw_no_such_family_total"),
    ], exported)) == 5


def test_every_series_contrib_reads_is_exported_by_the_code_or_recorded(exported):
    """Beside test_contrib's check against docs/metrics.rst: the code's own families, so a page cannot vouch for one."""
    series = re.compile(r"\b(?:[a-z_]+:)?llmgw_[a-z0-9_]+(?::[a-z0-9_]+)?\b")
    recorded = {rule["record"] for rule in rules("recording.yml")}
    exprs = [r["expr"] for r in rules("alerts.yml") + rules("recording.yml")] + [e for _, e in dashboard_queries()]
    unknown = {name for expr in exprs for name in series.findall(expr)} - set(exported) - recorded
    assert unknown == set()


def test_each_familys_type_in_docs_metrics_rst_is_the_codes(exported):
    """What a dashboard's author reads before choosing rate() or deriv()."""
    text = (ROOT / "docs" / "metrics.rst").read_text()
    documented = dict(re.findall(r"^   \* - ``(llmgw_[a-z0-9_]+)``\n     - ([a-z]+)$", text, re.MULTILINE))
    assert len(documented) >= 50
    differ = {}
    for name, kind in documented.items():
        code = exported.get(name + "_bucket" if kind == "histogram" else name)
        if code is not None and code != kind and not (kind == "info" and code == "gauge"):
            differ[name] = (kind, code)
    assert differ == {}
