"""The admin page's cells wrap between words at a desktop's width, and a long id never widens the page.

``overflow-wrap: anywhere`` on every cell let the table count each cell's
narrowest width as one letter: at 1280 px the cluster page's columns were
squeezed until "ready" and "starting" broke mid-word.  These open the real
page (the real server's resources over a socket on 127.0.0.1, a fleet built
from recorded inventories) in Debian's chromium and measure the rendered
lines: a run of letters or digits drawn on two lines is a word broken
inside; the document wider than the window is a page that scrolls sideways.
"""

from __future__ import annotations

import json

import attrs
import pytest
import pytest_twisted

from llmgw.control.fleet import Fleet
from llmgw.records import EngineInfo, ShardSpec, ShardStatus
from llmgw.states import EngineState
from llmgw.views import ReplicaView, ShardView
from tests.admin.conftest import FakeSource
from tests.admin.test_browser import artifacts
from tests.support.reportedfleet import gpu_node, quiet_node
from tests.support.browser import Browser

pytestmark = [pytest.mark.browser, pytest.mark.integration]

LONG_ID = "qwen2.5-coder-32b-instruct-awq-for-the-search-team-replica-with-a-long-name"
LONG_URL = "https://huggingface.co/org/a-model-with-a-long-repository-name/resolve/main/model-00001-of-00004.safetensors"
REASON = ("needs libgomp.so.1, which this node does not have: apt-get install libgomp1, or name another build "
          "in engines.llama.cpp and reload")


@attrs.define
class LongSource(FakeSource):
    """The fleet's views with the longest ids, sources and reasons an operator's fleet shows."""

    url: str = LONG_URL

    def replicas(self):
        return [
            ReplicaView("qwen", "qwen/0", "ready", nodes=["gpu01"], endpoint="http://10.0.0.5:8000", age_s=4000,
                        shards=[ShardView("qwen/0/0", node="gpu01", state="ready", rank=0)]),
            ReplicaView(LONG_ID, f"{LONG_ID}/0", "starting", nodes=["gpu01", "cpu07"], age_s=30, stale=False,
                        reason=f"fetching {self.url}: 3.1 GB of 17.2 GB, waiting for the download to finish",
                        shards=[ShardView(f"{LONG_ID}/0/0", node="gpu01", state="starting", rank=0, reason=REASON),
                                ShardView(f"{LONG_ID}/0/1", node="cpu07", state="starting", rank=1)]),
        ]


# A token no column can hold: a path of 300 letters in a node's words.
HUGE = "/srv/" + "x" * 300 + "/model.gguf"


@pytest.fixture(params=["realistic", "huge"])
def source(request, clock):
    fleet = Fleet(clock, lambda kind, ident, event: None, unreachable_after=15, lost_after=60)
    node = gpu_node()
    engines = [*node.engines, EngineInfo(name="vllm", version="0.11.0", state=EngineState.BROKEN, reason=REASON)]
    fleet.register("gpu01", 1, attrs.evolve(node, engines=engines, labels={"team": "search-and-recommendations"}))
    fleet.register("cpu07", 2, quiet_node())
    spec = ShardSpec(shard_id=f"{LONG_ID}/0/0", replica_id=f"{LONG_ID}/0", model=LONG_ID, engine="vllm")
    fleet.place("gpu01", spec)
    fleet.shard_status("gpu01", ShardStatus(spec=spec, state="starting", since=0.0))
    return LongSource(fleet, clock, url=LONG_URL if request.param == "realistic" else HUGE)


# Every run of letters or digits in a cell, heading or warning that the page draws on more than one line.
BROKEN_WORDS = """(() => {
  const broken = [];
  for (const el of document.querySelectorAll('td, th, h1, .warnings li')) {
    const walk = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
    for (let node = walk.nextNode(); node; node = walk.nextNode()) {
      for (const m of node.data.matchAll(/[A-Za-z0-9]{2,}/g)) {
        const range = document.createRange();
        range.setStart(node, m.index);
        range.setEnd(node, m.index + m[0].length);
        const lines = new Set([...range.getClientRects()].filter(r => r.width > 0).map(r => Math.round(r.top)));
        if (lines.size > 1) broken.push(m[0]);
      }
    }
  }
  return JSON.stringify(broken);
})()"""
# How far the document, and the content under the header, are wider than what shows them.
OVERFLOW = """[document.scrollingElement.scrollWidth - window.innerWidth,
  document.querySelector('main').scrollWidth - document.querySelector('main').clientWidth]"""
PAGES = ("/", "/node?id=gpu01", f"/replica?id={LONG_ID}/0")


async def look(browser: Browser, url: str, width: int) -> tuple[list[str], list[int]]:
    await browser.viewport(width, 800)
    await browser.goto(url)
    await browser.until("document.readyState === 'complete' && document.querySelector('main') !== null", url)
    return json.loads(await browser.evaluate(BROKEN_WORDS)), await browser.evaluate(OVERFLOW)


@pytest_twisted.ensureDeferred
async def test_cells_wrap_between_words_and_long_ids_stay_inside_the_page(admin, chromium, tmp_path, source):
    """Realistic: every id, URL and reason fits the table.  Huge: only the content under the header scrolls."""
    huge = source.url == HUGE
    browser = await Browser.start(chromium, tmp_path)
    try:
        seen = {}
        for path in PAGES:
            for width in (1280, 1024, 390):
                broken, (page, content) = await look(browser, admin.url + path, width)
                # A token may break inside where its column is narrower than it (and at a phone's
                # width, where each row is a card); a word may not, at a desktop's width.
                words = [w for w in broken if len(w) < 12 and w not in LONG_ID + LONG_URL] if width > 760 else []
                seen[(path, width)] = (words, page, 0 if huge else content)
                name = path.strip("/").split("?")[0] or "cluster"
                await browser.screenshot(artifacts() / f"wrapping-{source.url == HUGE and 'huge' or 'realistic'}-{name}-{width}.png",
                                         width, 800)
        assert {key: value for key, value in seen.items() if value != ([], 0, 0)} == {}
        # The check can see a broken word: a cell made too narrow for its words.
        await browser.viewport(1280, 800)
        await browser.goto(admin.url + "/")
        await browser.until("document.querySelector('td') !== null", "a table")
        await browser.evaluate("document.querySelector('td').style.cssText = 'display: block; width: 3ch; overflow-wrap: anywhere'")
        assert json.loads(await browser.evaluate(BROKEN_WORDS)) != []
    finally:
        await browser.close()
