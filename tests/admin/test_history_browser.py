"""The events and the last hour's charts in Debian's chromium: drawn, read back, no CSP or console error, no axe violation.

The page is the real ``AdminPage`` over a socket on 127.0.0.1; the journal
and the figures are ``tests.support.histories``' known pattern, which the
test reads back from each chart's ``data-points`` and its words.  Each page
is saved at 1280×900 and 390×844 in the test's tmp dir and under
$LLMGW_TEST_ARTIFACTS (``history-*.png``).
"""

from __future__ import annotations

import json
import shutil

import pytest
import pytest_twisted

from llmgw.states import ReplicaState
from llmgw.views import ReplicaView, ShardView
from tests.admin.test_browser import artifacts
from tests.support import axe, histories
from tests.support.browser import Browser

pytestmark = [pytest.mark.browser, pytest.mark.integration]

SIZES = {"desktop": (1280, 900), "phone": (390, 844)}
QWEN = "figure[data-subject='qwen'][data-series='requests_per_s']"


def elastic_replicas():
    """A ready replica, a sleeping one and one waking on demand, as the control plane shows them."""
    return [
        ReplicaView("qwen", "qwen/0", ReplicaState.READY, nodes=["gpu01"], endpoint="http://10.0.0.5:8000", age_s=900,
                    shards=[ShardView("qwen/0/0", node="gpu01", state="ready", rank=0)]),
        ReplicaView("llama", "llama/0", ReplicaState.SLEEPING, reason="idle: scaled to zero, last request 14 min ago"),
        ReplicaView("mistral", "mistral/0", ReplicaState.STARTING, nodes=["gpu01"], age_s=12,
                    reason="starting on demand: 3 requests waiting, 12 s",
                    shards=[ShardView("mistral/0/0", node="gpu01", state="starting", rank=0)]),
    ]


async def shoot(browser: Browser, tmp_path, name: str) -> None:
    """The whole page at each size, and the screen an operator sees scrolled to the events and to the charts."""
    artifacts().mkdir(parents=True, exist_ok=True)
    for size, (width, height) in SIZES.items():
        shots = [await browser.screenshot(tmp_path / f"history-{name}-{size}-full.png", width, height, full=True)]
        for part in ("events", "figures"):
            if await browser.evaluate(f"(e => e ? (e.scrollIntoView(), true) : false)(document.getElementById('{part}'))"):
                shots.append(await browser.screenshot(tmp_path / f"history-{name}-{size}-{part}.png", width, height))
        for shot in shots:
            shutil.copyfile(shot, artifacts() / shot.name)
    await browser.viewport(*SIZES["desktop"])


@pytest_twisted.ensureDeferred
async def test_an_operator_reads_the_events_and_the_last_hour_on_the_cluster_page(admin, chromium, tmp_path, source,
                                                                                   monkeypatch):
    monkeypatch.setattr(type(source), "replicas", lambda self: elastic_replicas())
    browser = await Browser.start(chromium, tmp_path)
    try:
        await browser.call("Log.enable")
        await browser.viewport(*SIZES["desktop"])
        await browser.goto(admin.url + "/")
        await browser.until(f"document.querySelector(\"{QWEN}\") !== null", "qwen's requests/s chart")
        # The known pattern, read back from what was drawn: every bucket, gaps as '-'.
        points = await browser.evaluate(f"document.querySelector(\"{QWEN} svg\").dataset.points")
        assert points.split() == ["-" if p is None else repr(p) for p in histories.QWEN_REQUESTS]
        caption = await browser.text(f"{QWEN} figcaption")
        assert caption == "now 3.5 req/s, lowest 2 req/s, highest 3.5 req/s, mean 2.15 req/s"
        # The line is drawn where the traffic was: the last sixth of the chart, and on screen.
        box = await browser.evaluate(f"(() => {{ const b = document.querySelector(\"{QWEN} polyline\").getBBox();"
                                     " return [b.x, b.width]; })()")
        assert 245 < box[0] < 255 and box[1] > 40
        assert await browser.evaluate(f"document.querySelector(\"{QWEN} svg\").getBoundingClientRect().width") > 200
        # What a screen reader says of it: its title and description.
        label = await browser.evaluate(
            f"document.querySelector(\"{QWEN} svg\").getAttribute('aria-labelledby').split(' ')"
            ".map(id => document.getElementById(id).textContent).join(' | ')")
        assert label == f"requests/s of model qwen, last 1 h | {caption}"
        assert await browser.evaluate("document.querySelectorAll('figure.chart').length") == 9
        # The events, newest first, the node's words as text.
        events = await browser.evaluate("[...document.querySelectorAll('table.events tbody tr')]"
                                        ".map(r => r.dataset.kind)")
        assert events[:3] == ["reload", "slept", "node lost"] and len(events) == 9
        exited = await browser.text("table.events tr[data-seq='5'] td.reason")
        assert exited == "exited 137 (killed): <script>alert('pwned')</script>\\x1b[2J\\u202e"
        assert await browser.evaluate("document.querySelectorAll('table.events td.reason *').length") == 0
        # A sleeping replica and a waking one.
        sleeping = await browser.evaluate("getComputedStyle(document.querySelector('.state.sleeping')).color")
        assert sleeping == "rgb(90, 79, 207)"
        body = await browser.text("main")
        assert "idle: scaled to zero, last request 14 min ago" in body
        assert "starting on demand: 3 requests waiting, 12 s" in body
        found = await axe.violations(browser)
        assert found == [], "\n".join(found)
        await shoot(browser, tmp_path, "cluster")
        # At a phone's width nothing scrolls sideways, and each chart fills the line.
        await browser.viewport(*SIZES["phone"])
        wide = await browser.evaluate("[document.scrollingElement.scrollWidth - window.innerWidth,"
                                      f" document.querySelector(\"{QWEN}\").getBoundingClientRect().width]")
        assert wide[0] <= 0 and wide[1] > 300
        await browser.viewport(*SIZES["desktop"])

        await browser.goto(admin.url + "/node?id=gpu01")
        await browser.until("document.querySelectorAll('figure.chart').length === 3", "gpu01's three charts")
        gaps = await browser.evaluate("document.querySelector(\"figure[data-series='gpu_util_pct'] svg\")"
                                      ".querySelectorAll('polyline').length")
        assert gaps == 2  # five minutes without heartbeats leave the line open
        assert await browser.evaluate("[...document.querySelectorAll('table.events tbody tr')]"
                                      ".map(r => r.dataset.seq).join(' ')") == "6 5 4 3 2"
        found = await axe.violations(browser)
        assert found == [], "\n".join(found)
        await shoot(browser, tmp_path, "node")

        await browser.goto(admin.url + "/replica?id=qwen%2F0")
        await browser.until("document.querySelectorAll('figure.chart').length === 6", "qwen's six charts")
        await shoot(browser, tmp_path, "replica")
        assert browser.problems == []
    finally:
        await browser.close()
