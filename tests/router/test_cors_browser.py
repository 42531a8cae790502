"""CORS in a real browser: a page of another origin calls POST /v1/chat/completions with fetch().

Debian's chromium, headless (tests/support/browser.py), opens a page served
from ``http://localhost:PAGE``; the page's script calls a real llmgw-router on
``http://127.0.0.1:API`` with a JSON body and an ``Authorization`` field, so
the browser asks a preflight first, as a browser app's would.  With the page's
origin in ``router.cors.allow_origins`` the script reads the answer (and the
``X-Request-Id`` the router exposes to it), from the simulator and from an
engine that sends an ``Access-Control-Allow-Origin`` of its own, as llama.cpp's
server does (a second one in the answer is refused by the browser); without,
the browser refuses it and ``fetch`` rejects with a TypeError.
"""

from __future__ import annotations

import json

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.web import resource, server

from tests.support.browser import Browser
from tests.support.routerproc import RouterProcess
from tests.support.sim import MODEL, SimProcess
from tests.support.toolengine import MODEL as LIKE_LLAMA_CPP
from tests.support.toolengine import ToolEngineProcess

pytestmark = [pytest.mark.browser, pytest.mark.integration]

CALL = """fetch(%(url)s, {method: "POST", headers: {"Content-Type": "application/json", "Authorization": "Bearer sk-page"},
                    body: JSON.stringify({model: %(model)s, messages: [{role: "user", content: "cross origin"}],
                                          max_tokens: 2})})
  .then(r => r.json().then(body => ({status: r.status, request_id: r.headers.get("x-request-id"),
                                     content: body.choices ? body.choices[0].message.content : null})))
  .catch(e => ({error: e.name + ": " + e.message}))"""


class _Page(resource.Resource):
    isLeaf = True

    def render_GET(self, request):
        request.setHeader(b"content-type", b"text/html; charset=utf-8")
        return b"<!doctype html><title>another site</title><p>a browser app on another origin</p>"


@pytest.fixture
def page():
    site = server.Site(_Page())
    site.noisy = False
    listening = reactor.listenTCP(0, site, interface="127.0.0.1")
    yield f"http://localhost:{listening.getHost().port}"
    listening.stopListening()


@pytest.fixture
def routers(tmp_path, page):
    """(a router that names the page's origin in router.cors.allow_origins, one that names none)."""
    sim = SimProcess()
    engine = ToolEngineProcess()
    served = {MODEL: sim.base_url, LIKE_LLAMA_CPP: engine.base_url}
    allowing = RouterProcess(tmp_path, served, f'  cors: {{allow_origins: ["{page}"]}}\n', "allowing")
    plain = RouterProcess(tmp_path, served, name="plain")
    try:
        yield allowing.start(), plain.start()
    finally:
        for part in (allowing, plain, engine, sim):
            part.stop()


async def call_from(browser: Browser, router: RouterProcess, model: str = MODEL) -> dict:
    return await browser.evaluate(CALL % {"url": json.dumps(router.base_url + "/v1/chat/completions"),
                                          "model": json.dumps(model)})


@pytest_twisted.ensureDeferred
async def test_a_page_of_a_listed_origin_reads_the_answer_and_others_are_refused(chromium, tmp_path, page, routers):
    allowing, plain = routers
    browser = await Browser.start(chromium, tmp_path)
    try:
        await browser.goto(page + "/")
        allowed = await call_from(browser, allowing)
        assert allowed.get("status") == 200, (allowed, allowing.output()[-2000:])
        assert allowed["content"].split() == ["cross", "origin"]
        assert allowed["request_id"], "the page cannot read X-Request-Id: Access-Control-Expose-Headers lacks it"
        refused = await call_from(browser, plain)
        assert refused == {"error": "TypeError: Failed to fetch"}, refused
    finally:
        await browser.close()


@pytest_twisted.ensureDeferred
async def test_an_engines_own_cors_field_does_not_spoil_the_routers(chromium, tmp_path, page, routers):
    """Two Access-Control-Allow-Origin fields, the router's and the engine's, are refused as "multiple values"."""
    allowing, _ = routers
    browser = await Browser.start(chromium, tmp_path)
    try:
        await browser.goto(page + "/")
        allowed = await call_from(browser, allowing, LIKE_LLAMA_CPP)
        assert allowed.get("status") == 200, (allowed, browser.problems)
        assert allowed["content"] == "cross origin"
    finally:
        await browser.close()
