"""Every HTTP listener llmgw runs names no software or version, and answers an error in llmgw's words.

Before, the admin listener and the page under ``/admin`` on the API listener
(twisted.web) sent ``Server: TwistedWeb/<version>`` with every answer, and
answered a failing page with twisted.web's "Processing Failed" page, a
method it does not take with "Your browser approached me...", a page that
returned the wrong type with the reprs of the request and the resource.
Now none of llmgw's listeners (llmgw-server's admin and API listeners,
llmgw-router's, the engine simulator) sends a ``Server`` header, and the
twisted.web ones answer those errors as plain text in llmgw's words, with
the traceback in the server's log only.
"""

from __future__ import annotations

import pytest
import pytest_twisted
from prometheus_client import CollectorRegistry
from twisted.internet import endpoints, reactor, threads
from twisted.web.resource import Resource

from llmgw.admin.mount import page_site
from llmgw.admin.web import SERVER_FAULT, admin_site
from tests.admin.conftest import raw
from tests.link.test_limits import Logged
from tests.router.test_process_names import router_process  # noqa: F401  (fixture)
from tests.support.cluster import cluster  # noqa: F401  (fixture)
from tests.support.sim import sim  # noqa: F401  (fixture)

# What would name the software behind a listener, or show its insides.
TELLING = ("twisted", "autobahn", "python", "traceback", "processing failed", "no such resource", "approached me",
           "huh?", "request did not return bytes", "<twisted", "object at 0x")


def told(answer, body: bool = True) -> list[str]:
    """What in *answer* names software or shows internals: a Server header, and any of ``TELLING``.

    /metrics is read without its *body*: ``llmgw_router_build_info`` names
    the versions on purpose, for the operator who may read it.
    """
    found = [f"Server: {v}" for v in answer.headers.getRawHeaders("server") or []]
    text = (answer.body.lower() if body else "") + b" ".join(
        v for _, values in answer.headers.getAllRawHeaders() for v in values).decode("latin-1").lower()
    return found + [word for word in TELLING if word in text]


def ask(port: int, line: str, *headers: str):
    return raw(port, "\n".join([line, "Host: 127.0.0.1", "Connection: close", *headers]))


class Failing(Resource):
    """A page with a fault in it: it raises, or answers text where bytes are due, or takes GET only."""

    isLeaf = True

    def render_GET(self, request):
        if request.postpath and request.postpath[-1] == b"raise":
            raise KeyError("/srv/llmgw/secret")
        if request.postpath and request.postpath[-1] == b"str":
            return "not bytes"
        return b"fine\n"


@pytest_twisted.async_yield_fixture
async def faulty():
    """The admin listener's site and the API listener's page site, each with ``Failing`` as its page, on 127.0.0.1."""
    ports = [await endpoints.TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(site)
             for site in (admin_site(CollectorRegistry(), Failing()), page_site(Failing()))]
    yield [p.getHost().port for p in ports]
    for port in ports:
        await port.stopListening()


@pytest_twisted.ensureDeferred
async def test_a_page_that_fails_is_answered_in_llmgw_s_words_and_logged(faulty):
    admin, api = faulty
    for port, base in ((admin, ""), (api, "/admin")):
        with Logged() as logged:
            raised = await threads.deferToThread(ask, port, f"GET {base}/x/raise HTTP/1.1")
            wrong_type = await threads.deferToThread(ask, port, f"GET {base}/x/str HTTP/1.1")
        for answer in (raised, wrong_type):
            assert (answer.code, answer.body) == (500, SERVER_FAULT + "\n"), (port, answer.body)
            assert answer.headers.getRawHeaders("content-type") == ["text/plain; charset=utf-8"]
            assert told(answer) == []
        failures = [e["log_failure"].value for e in logged.events if e.get("log_failure") is not None]
        assert [repr(f) for f in failures] == ["KeyError('/srv/llmgw/secret')"]  # the log keeps the traceback
        assert any(f"Failing answered {base}/x/str with str, not bytes" in line for line in logged.lines())


@pytest_twisted.ensureDeferred
async def test_a_method_or_path_twisted_web_would_answer_itself_is_answered_in_llmgw_s_words(faulty):
    admin, api = faulty
    for port, base in ((admin, ""), (api, "/admin")):
        deleted = await threads.deferToThread(ask, port, f"DELETE {base}/x HTTP/1.1")
        assert deleted.code == 405 and deleted.body.startswith("this path answers "), deleted.body
        [allow] = deleted.headers.getRawHeaders("allow")
        assert sorted(allow.split(", ")) == ["GET", "HEAD"] and allow in deleted.body
        brewed = await threads.deferToThread(ask, port, f"BREW {base}/x HTTP/1.1")
        assert brewed.code == 501 and told(brewed) == [], brewed.body
        head = await threads.deferToThread(ask, port, f"HEAD {base}/x HTTP/1.1")
        assert (head.code, head.body) == (200, "")
        for answer in (deleted, head):
            assert told(answer) == []
    for target in ("/metrics/x", "/"):
        missing = await threads.deferToThread(ask, admin if target != "/" else api, f"GET {target} HTTP/1.1")
        assert missing.code == 404 and told(missing) == [], (target, missing.body)


@pytest.mark.integration
def test_llmgw_server_s_listeners_name_no_software(cluster):  # noqa: F811
    cluster.start_server()
    answers = {
        f"admin {line}": ask(cluster.admin_port, line)
        for line in ("GET / HTTP/1.1", "GET /healthz HTTP/1.1", "GET /metrics HTTP/1.1", "GET /nope HTTP/1.1",
                     "DELETE /healthz HTTP/1.1", "BREW / HTTP/1.1")
    } | {
        f"api {line}": ask(cluster.api_port, line)
        for line in ("GET /admin/ HTTP/1.1", "PUT /admin/ HTTP/1.1", "GET /v1/models HTTP/1.1", "GET /nope HTTP/1.1")
    }
    assert {what: said for what, answer in answers.items() if (said := told(answer, "/metrics" not in what))} == {}


def test_llmgw_router_s_listeners_and_the_simulator_name_no_software(router_process, sim):  # noqa: F811
    api, admin = router_process()
    answers = {
        f"router admin {line}": ask(admin, line)
        for line in ("GET / HTTP/1.1", "GET /healthz HTTP/1.1", "GET /metrics HTTP/1.1", "GET /nope HTTP/1.1",
                     "POST /metrics HTTP/1.1")
    } | {
        f"router api {line}": ask(api, line) for line in ("GET /v1/models HTTP/1.1", "GET /nope HTTP/1.1")
    } | {
        f"sim {line}": ask(sim.port, line) for line in ("GET /v1/models HTTP/1.1", "GET /nope HTTP/1.1",
                                                         "GET /metrics HTTP/1.1")
    }
    assert {what: said for what, answer in answers.items() if (said := told(answer, "/metrics" not in what))} == {}
