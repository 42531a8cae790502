"""DNS rebinding and its kin against the OpenAI API: a browser tricked into asking the router gets nothing.

A page at ``rebind.attacker.example`` re-points its name at 127.0.0.1; an
operator's browser then sends the page's requests to a key-less API there,
with ``Host: rebind.attacker.example``, and would let the page read the
answers.  A page on any other site can make the browser send requests too
(it cannot read the answers, but the engines would do the work).  Each
request here is written byte for byte over a real socket to a router in the
test's reactor, in front of a real sim engine.
"""

from __future__ import annotations

import hashlib
import json
import socket

import pytest
import pytest_twisted
from twisted.internet import reactor, threads

from llmgw.config.routing import APIKey, RouterSettings, StaticEndpoint
from llmgw.router.service import Router
from tests.admin.conftest import Answer, raw
from tests.support.net import free_port
from tests.support.sim import MODEL

CHAT = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).encode()
# Every route, and one that is none: each is refused alike.
ASKS = (("POST", "/v1/chat/completions", CHAT), ("POST", "/v1/completions", json.dumps({"model": MODEL, "prompt": "x"}).encode()),
        ("GET", "/v1/models", b""), ("GET", f"/v1/models/{MODEL}", b""), ("HEAD", "/v1/models", b""),
        ("GET", "/nothing", b""))
TOKEN = "sk-llmgw-door-test"


def _ask(port: int, method: str, target: str, host: str | None, body: bytes, more: str) -> Answer:
    lines = [f"{method} {target} HTTP/1.1", *([f"Host: {host}"] if host is not None else []), "Connection: close"]
    if body:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return raw(port, "\n".join(lines + [more]), body)


def error(answer: Answer) -> dict:
    return json.loads(answer.body)["error"]


def cors(answer: Answer) -> list[bytes]:
    return [name for name, _ in answer.headers.getAllRawHeaders() if name.lower().startswith(b"access-control-")]


def engine_requests(sim) -> float:
    return sum(v for k, v in sim.metrics().items() if k.startswith("llmgw_sim_requests_total"))


class Served:
    """A ``router.service.Router`` on 127.0.0.1 in front of the sim, as server.yaml's ``router:`` says."""

    def __init__(self, sim, **settings):
        self.port = free_port()
        self.sim = sim
        self.router = Router(reactor, self.settings(**settings), f"tcp:{self.port}:interface=127.0.0.1")
        self.router.startService()

    def settings(self, **settings) -> RouterSettings:
        return RouterSettings(endpoints=(StaticEndpoint(MODEL, self.sim.base_url),), **settings)

    async def ask(self, host: str | None, method: str = "GET", target: str = "/v1/models", body: bytes = b"",
                  more: str = "") -> Answer:
        return await threads.deferToThread(_ask, self.port, method, target, host, body, more)


@pytest_twisted.async_yield_fixture
async def served(sim):
    made: list[Served] = []

    def make(**settings) -> Served:
        made.append(Served(sim, **settings))
        return made[-1]

    yield make
    for one in made:
        await one.router.stopService()


@pytest_twisted.ensureDeferred
async def test_a_keyless_api_asked_for_a_name_that_is_not_its_own_answers_421_and_calls_no_engine(served, sim):
    api = served()
    port = api.port
    before = engine_requests(sim)
    for host in (f"rebind.attacker.example:{port}", "rebind.attacker.example", f"localhost.attacker.example:{port}",
                 f"127.0.0.1.nip.io:{port}", "LOCALHOST.Attacker.Example.", f"xn--lcalhost-9za:{port}"):
        for method, target, body in ASKS:
            answer = await api.ask(host, method, target, body)
            assert answer.code == 421, (host, target, answer.code, answer.body)
            assert MODEL not in answer.body, (host, target)
            if method != "HEAD":
                said = error(answer)
                assert said["code"] == "misdirected_request", (host, target)
                assert "add it to router.hosts in server.yaml and reload" in said["message"], said
        # What a proxy would say about the host is nobody's word here.
        forwarded = await api.ask(host, more=f"X-Forwarded-Host: localhost:{port}")
        assert forwarded.code == 421, host
    # Nothing reached the engine: a chat from an own name, sent after all of the above, is the first it sees.
    assert (await api.ask(f"127.0.0.1:{port}", "POST", "/v1/chat/completions", CHAT)).code == 200
    assert engine_requests(sim) == before + 1


@pytest_twisted.ensureDeferred
async def test_a_keyless_api_answers_its_own_names_and_any_address_whatever_the_port(served):
    api = served()
    port = api.port
    for host in (f"127.0.0.1:{port}", "127.0.0.1", f"localhost:{port}", f"LocalHost:{port}", f"localhost.:{port}",
                 "localhost:8080", f"[::1]:{port}", "[::1]", f"{socket.gethostname()}:{port}", f"10.0.0.5:{port}"):
        answer = await api.ask(host)
        assert answer.code == 200 and MODEL in answer.body, host
        chat = await api.ask(host, "POST", "/v1/chat/completions", CHAT)
        assert chat.code == 200, (host, chat.body)


@pytest_twisted.ensureDeferred
async def test_a_keyless_api_refuses_no_host_two_hosts_a_malformed_one_or_a_url(served, sim):
    api = served()
    port = api.port
    before = engine_requests(sim)
    for method, target, body in ASKS:
        assert (await api.ask(None, method, target, body)).code == 400, target
        two = await api.ask(f"127.0.0.1:{port}", method, target, body, more="Host: rebind.attacker.example")
        assert two.code == 400, target
        if method != "HEAD":
            assert "one Host header" in error(two)["message"], target
    for host in (f"localhost:{port}:{port}", "localhost:99999", "localhost:http", "local host", "[::1",
                 "[localhost]:80", f"rebind.attacker.example@127.0.0.1:{port}", "", "a..b", "-a",
                 "\xe9.example", f"127.0.0.1:{port}, rebind.attacker.example", "localhost\trebind.attacker.example"):
        answer = await api.ask(host, "POST", "/v1/chat/completions", CHAT)
        assert answer.code == 400 and "Host header" in error(answer)["message"], (host, answer.body)
    # A URL for a target names a second host: only a proxy is sent those.
    for target in ("http://rebind.attacker.example/v1/chat/completions", f"http://127.0.0.1:{port}/v1/chat/completions"):
        answer = await api.ask(f"127.0.0.1:{port}", "POST", target, CHAT)
        assert answer.code == 400 and "not a URL" in error(answer)["message"], target
    assert engine_requests(sim) == before


@pytest_twisted.ensureDeferred
async def test_router_hosts_is_the_list_of_names_and_a_reload_changes_it(served):
    api = served(hosts=("llm.example.com",))
    port = api.port
    for host in ("llm.example.com", f"LLM.example.COM.:{port}", "10.0.0.5"):
        assert (await api.ask(host)).code == 200, host
    refused = await api.ask(f"localhost:{port}")  # the list replaces the default names
    assert refused.code == 421
    assert error(refused)["message"].startswith(
        "localhost is not a name of this router's OpenAI API, which has no keys (an IP address always is)")
    assert "llm.example" not in refused.body  # a rebound page reads the 421: it learns none of the names
    api.router.reconfigure(api.settings(hosts=()))
    assert (await api.ask("llm.example.com")).code == 421 and (await api.ask("127.0.0.1")).code == 200
    api.router.reconfigure(api.settings())
    assert (await api.ask(f"localhost:{port}")).code == 200


@pytest_twisted.ensureDeferred
async def test_a_keyless_api_refuses_what_a_browser_sends_from_another_sites_page(served, sim):
    # A page need not rebind to make the browser send a simple request (text/plain, no preflight) to
    # 127.0.0.1: it cannot read the answer, but the engine would work for it.
    api = served()
    port = api.port
    host = f"127.0.0.1:{port}"
    before = engine_requests(sim)
    for says in ("Origin: http://evil.example", "Origin: null", f"Origin: http://127.0.0.1:{port + 1}",
                 f"Origin: http://localhost:{port}", f"Origin: http://evil@127.0.0.1:{port}", "Origin: not a url",
                 "Referer: http://evil.example/page", "Sec-Fetch-Site: cross-site", "Sec-Fetch-Site: same-site",
                 f"Origin: http://127.0.0.1:{port}\nSec-Fetch-Site: cross-site"):
        for method, target, body in ASKS:
            answer = await api.ask(host, method, target, body, more=says)
            assert answer.code == 403, (says, target, answer.code)
            if method != "HEAD":
                assert error(answer)["code"] == "cross_site_request" and MODEL not in answer.body, says
    assert engine_requests(sim) == before
    for says in (f"Origin: http://127.0.0.1:{port}", f"Referer: http://127.0.0.1:{port}/x",
                 "Sec-Fetch-Site: none", f"Origin: http://127.0.0.1:{port}\nSec-Fetch-Site: same-origin", ""):
        assert (await api.ask(host, "POST", "/v1/chat/completions", CHAT, more=says)).code == 200, says


@pytest_twisted.ensureDeferred
async def test_no_answer_carries_cors_headers_so_no_other_sites_page_may_read_one(served):
    api = served()
    port = api.port
    preflight = await api.ask(f"127.0.0.1:{port}", "OPTIONS", "/v1/chat/completions",
                              more="Origin: http://evil.example\nAccess-Control-Request-Method: POST")
    assert preflight.code != 200
    for method, target, body in ASKS:
        answer = await api.ask(f"127.0.0.1:{port}", method, target, body)
        assert not cors(answer), (target, cors(answer))
    assert not cors(preflight)


@pytest_twisted.ensureDeferred
async def test_an_api_with_keys_answers_any_name_but_lists_its_models_only_to_a_key(served, sim):
    # A browser sends no bearer token by itself, so a rebound page's requests carry none: the key is the guard.
    other = APIKey(name="other", sha256=hashlib.sha256(b"sk-other").hexdigest(), models=("elsewhere",))
    key = APIKey(name="ci", sha256=hashlib.sha256(TOKEN.encode()).hexdigest())
    api = served(keys=(key, other))
    for host in ("rebind.attacker.example", "127.0.0.1"):
        for target in ("/v1/models", f"/v1/models/{MODEL}"):
            refused = await api.ask(host, "GET", target)
            assert refused.code == 401 and MODEL not in refused.body, (host, target)
            assert error(refused)["code"] == "invalid_api_key"
            wrong = await api.ask(host, "GET", target, more="Authorization: Bearer sk-wrong")
            assert wrong.code == 401 and MODEL not in wrong.body, (host, target)
        listed = await api.ask(host, more=f"Authorization: Bearer {TOKEN}")
        assert listed.code == 200 and [m["id"] for m in json.loads(listed.body)["data"]] == [MODEL]
        assert (await api.ask(host, target=f"/v1/models/{MODEL}", more=f"Authorization: Bearer {TOKEN}")).code == 200
        chat = await api.ask(host, "POST", "/v1/chat/completions", CHAT, more=f"Authorization: Bearer {TOKEN}")
        assert chat.code == 200, host
    # A key is shown only the models it may use.
    mine = await api.ask("127.0.0.1", more="Authorization: Bearer sk-other")
    assert mine.code == 200 and json.loads(mine.body)["data"] == []
    assert (await api.ask("127.0.0.1", target=f"/v1/models/{MODEL}", more="Authorization: Bearer sk-other")).code == 404
    # Keys removed on reload: the API is key-less, and its names are held again.
    api.router.reconfigure(api.settings())
    assert (await api.ask("rebind.attacker.example")).code == 421


@pytest.mark.parametrize("file", ["server", "router"])
def test_router_hosts_is_names_absent_is_the_defaults(tmp_path, file):
    from llmgw.config import load_server_config
    from llmgw.config.router import load_router_config
    from llmgw.errors import ConfigError

    for name in ("ca.crt", "s.crt", "s.key"):
        (tmp_path / name).write_text("")
    if file == "server":
        head, load = "listen: {link: 'ssl:7443'}\ntls: {ca: ca.crt, cert: s.crt, key: s.key}\n", load_server_config
    else:
        head, load = "", load_router_config
    body = "router:\n  endpoints: [{model: m, url: 'http://127.0.0.1:9'}]\n"
    path = tmp_path / f"{file}.yaml"
    path.write_text(head + body)
    assert load(path).router.hosts is None
    path.write_text(head + body + "  hosts: [LLM.Example.com., localhost]\n")
    assert load(path).router.hosts == ("llm.example.com", "localhost")
    path.write_text(head + body + "  hosts: []\n")
    assert load(path).router.hosts == ()
    for bad in ("'http://llm'", "'llm:8080'", "'*.example.com'", "''", "'llm 01'"):
        path.write_text(head + body + f"  hosts: [{bad}]\n")
        with pytest.raises(ConfigError, match=r"router\.hosts.*not a host name; write it like 'gw01.example.com'"):
            load(path)
