"""Who may use the admin page, and what a hostile node, page or client can make it do: nothing."""

from __future__ import annotations

import hashlib

import attrs
import pytest
import pytest_twisted

from llmgw.admin.auth import Guard, Throttled
from tests.admin.conftest import HOSTILE, OPERATOR_KEY, Client, settings

pytestmark = pytest.mark.filterwarnings("ignore:Using readBody with a transport:DeprecationWarning")


@pytest_twisted.ensureDeferred
async def test_every_answer_carries_a_strict_content_security_policy(admin):
    client = Client(admin.url)
    for path in ("/", "/node?id=gpu01", "/replica?id=qwen/0", "/confirm?node=gpu01&action=drain",
                 "/static/admin.js", "/nothing-here", "/logs.json?node=gpu01"):
        answer = await client.get(path)
        csp = answer.header("content-security-policy") or ""
        assert "default-src 'none'" in csp and "script-src 'self'" in csp and "frame-ancestors 'none'" in csp, path
        assert "unsafe-inline" not in csp, path
        assert answer.header("x-content-type-options") == "nosniff", path
    # No inline script for the policy to refuse: the one script is a file.
    page = (await client.get("/")).body
    assert page.count("<script") == 1 and '<script src="/static/admin.js"' in page


@pytest_twisted.ensureDeferred
async def test_a_request_from_beyond_admin_local_sees_only_the_sign_in_form(admin):
    stranger = Client(admin.url, "127.0.0.2")  # loopback, but admin.local is 127.0.0.1/32 here
    for path in ("/", "/node?id=gpu01", "/replica?id=qwen/0", "/logs.json?node=gpu01", "/progress.json"):
        answer = await stranger.get(path)
        assert answer.code == 401, path
        assert "gpu01" not in answer.body and "operator key" in answer.body, path
    token = (await stranger.get("/")).csrf()
    refused = await stranger.post("/action", {"csrf": token, "node": "gpu01", "action": "drain"})
    assert refused.code == 401 and "sign in first" in refused.body
    assert admin.page.source.acted == []


@pytest_twisted.ensureDeferred
async def test_the_page_that_does_not_trust_admin_local_asks_even_loopback_for_a_key(source, clock):
    # As under /admin on the API listener, where a proxy on this host makes every visitor 127.0.0.1.
    from prometheus_client import CollectorRegistry
    from twisted.internet import reactor

    from llmgw.admin.site import AdminPage
    from llmgw.admin.web import admin_site

    page = AdminPage(source, settings(), clock, trust_local=False)
    port = reactor.listenTCP(0, admin_site(CollectorRegistry(), page), interface="127.0.0.1")
    try:
        local = Client(f"http://127.0.0.1:{port.getHost().port}")
        answer = await local.request(b"GET", "/", headers={"x-forwarded-for": ["127.0.0.1"]})
        assert answer.code == 401 and "gpu01" not in answer.body
        assert "Under /admin on the API listener everyone signs in" in answer.body
        refused = await local.post("/action", {"csrf": answer.csrf(), "node": "gpu01", "action": "drain"})
        assert refused.code == 401 and source.acted == []
        signed_in = await local.post("/login", {"csrf": answer.csrf(), "key": OPERATOR_KEY})
        assert signed_in.code == 303
        assert "operator: ops" in (await local.get("/")).body
    finally:
        await port.stopListening()


@pytest_twisted.ensureDeferred
async def test_an_operator_key_gives_a_strict_http_only_session_and_logging_out_ends_it(admin, clock):
    stranger = Client(admin.url, "127.0.0.2")
    token = (await stranger.get("/login")).csrf()
    wrong = await stranger.post("/login", {"csrf": token, "key": "guessed"})
    assert wrong.code == 401 and "not one of admin.keys" in wrong.body
    # Right after a wrong key even the right one waits admin.login_backoff_s (1 s) unread.
    waits = await stranger.post("/login", {"csrf": token, "key": OPERATOR_KEY})
    assert waits.code == 429 and waits.header("retry-after") == "1"
    assert "too many wrong keys from 127.0.0.2: try again in 1 s" in waits.body
    assert admin.page.guard.sessions() == 0
    clock.advance(1)
    signed_in = await stranger.post("/login", {"csrf": token, "key": OPERATOR_KEY})
    assert signed_in.code == 303
    session = signed_in.cookies()["llmgw_admin_session"]
    assert session["httponly"] and session["samesite"].lower() == "strict"
    assert admin.page.guard.sessions() == 1
    page = await stranger.get("/")
    assert page.code == 200 and "operator: ops" in page.body and "gpu01" in page.body
    out = await stranger.post("/logout", {"csrf": page.csrf()})
    assert out.code == 303 and admin.page.guard.sessions() == 0
    assert (await stranger.get("/")).code == 401


@pytest_twisted.ensureDeferred
async def test_a_post_without_this_browsers_csrf_token_is_refused(admin):
    client = Client(admin.url)
    token = (await client.get("/confirm?node=gpu01&action=drain")).csrf()
    for form in ({"node": "gpu01", "action": "drain"},
                 {"csrf": "0" * 64, "node": "gpu01", "action": "drain"}):
        refused = await client.post("/action", form)
        assert refused.code == 403 and "CSRF" in refused.body
    # The right token from another browser (no cookie of its own) is no good either.
    other = Client(admin.url)
    assert (await other.post("/action", {"csrf": token, "node": "gpu01", "action": "drain"})).code == 403
    # Nor from a page on another origin, whatever it carries.
    cross = await client.post("/action", {"csrf": token, "node": "gpu01", "action": "drain"}, origin="http://evil.example")
    assert cross.code == 403
    assert admin.page.source.acted == []
    done = await client.post("/action", {"csrf": token, "node": "gpu01", "action": "drain"})
    assert done.code == 303 and admin.page.source.acted == [("drain", "gpu01")]
    assert done.header("location") == "/node?id=gpu01&done=drain"


@pytest_twisted.ensureDeferred
async def test_the_node_page_says_only_its_own_words_whatever_done_carries(admin):
    client = Client(admin.url)
    said = await client.get("/node?id=gpu01&done=drain")
    assert '<p class="notice">drain: done; its shards were stopped' in said.body
    for done in ("Your+session+expired%3A+sign+in+at+https%3A%2F%2Fevil.example", "%3Cb%3Ebold%3C%2Fb%3E", "drain%3A+done"):
        body = (await client.get(f"/node?id=gpu01&done={done}")).body
        assert 'class="notice"' not in body and "session expired" not in body and "bold" not in body, done


@pytest_twisted.ensureDeferred
async def test_a_hostile_log_line_and_node_label_are_shown_as_text(admin):
    client = Client(admin.url)
    for path in ("/node?id=gpu01", "/"):
        body = (await client.get(path)).body
        assert "<script>alert" not in body, path
    node = (await client.get("/node?id=gpu01")).body
    # The label, the log line, and the journal's reason for gpu01's replica exiting (its terminal escapes too).
    assert node.count("&lt;script&gt;alert('pwned')&lt;/script&gt;") == 3
    assert HOSTILE not in node
    assert "\\x1b[2J\\u202e" in node and "\x1b" not in node and "\u202e" not in node


@pytest_twisted.ensureDeferred
async def test_what_a_request_may_ask_is_bounded(admin, source):
    client = Client(admin.url)
    too_many = await client.get("/node?id=gpu01&n=100000")
    assert too_many.code == 400 and "admin.log_lines" in too_many.body
    assert (await client.get("/node?id=" + "x" * 300)).code == 400
    assert (await client.get("/logs.json?node=gpu01&source=" + "s" * 300)).code == 400
    assert (await client.get("/confirm?node=gpu01&action=reboot")).code == 400
    assert (await client.get("/node?id=nobody")).code == 404
    big = await client.post("/login", b"key=" + b"k" * 200_000)
    assert big.code == 413
    assert all(n <= admin.page.settings.log_lines for _, _, n in source.asked)


@pytest_twisted.ensureDeferred
async def test_what_the_page_renders_is_bounded(source, clock):
    from prometheus_client import CollectorRegistry
    from twisted.internet import reactor

    from llmgw.admin.site import AdminPage
    from llmgw.admin.web import admin_site

    source.lines = [f"line {i} " + "x" * 100 for i in range(400)]
    page = AdminPage(source, settings(max_rows=1, log_bytes=2048), clock)
    port = reactor.listenTCP(0, admin_site(CollectorRegistry(), page), interface="127.0.0.1")
    try:
        client = Client(f"http://127.0.0.1:{port.getHost().port}")
        cluster = (await client.get("/")).body
        assert "and 1 more nodes (admin.max_rows is 1)" in cluster
        logs = (await client.get("/logs.json?node=gpu01&n=400")).body
        import json

        answer = json.loads(logs)
        assert answer["lines"][-1].startswith("line 399") and 10 < len(answer["lines"]) < 20
        assert answer["clipped"] == 400 - len(answer["lines"])
    finally:
        await port.stopListening()


class FakeRequest:
    """What the guard reads of a request from 10.1.2.3 (not local here), with its cookies."""

    def __init__(self):
        self.cookies = {}

    def getClientAddress(self):
        return type("Address", (), {"host": "10.1.2.3"})()

    def getCookie(self, name):
        return self.cookies.get(name)

    def addCookie(self, name, value, **kw):
        self.cookies[name] = value

    def isSecure(self):
        return False


def test_a_session_ends_after_admin_session_ttl_s(clock):
    guard = Guard(settings(session_ttl_s=60), clock)

    request = FakeRequest()
    assert guard.operator(request) is None
    assert guard.login(request, OPERATOR_KEY) == "ops"
    assert guard.operator(request).name == "ops"
    clock.advance(59)
    assert guard.operator(request) is not None
    clock.advance(1)
    assert guard.operator(request) is None


def test_sessions_are_bounded_by_admin_max_sessions(clock):
    guard = Guard(settings(max_sessions=3), clock)

    for _ in range(10):
        guard.login(FakeRequest(), OPERATOR_KEY)
    assert guard.sessions() == 3


def test_a_peer_that_keeps_failing_waits_longer_each_time_up_to_the_bound(clock):
    guard = Guard(settings(login_backoff_s=2, max_login_wait_s=10), clock)
    stranger, other = FakeRequest(), type("Other", (FakeRequest,), {"getClientAddress": lambda self: type(
        "Address", (), {"host": "10.9.9.9"})()})()

    def waits_after_wrong_key() -> float:
        assert guard.login(stranger, "guessed") is None
        with pytest.raises(Throttled) as caught:
            guard.login(stranger, OPERATOR_KEY)
        return caught.value.wait_s

    assert waits_after_wrong_key() == 2
    clock.advance(2)
    assert waits_after_wrong_key() == 4
    clock.advance(4)
    assert waits_after_wrong_key() == 8
    clock.advance(8)
    assert waits_after_wrong_key() == 10  # admin.max_login_wait_s
    assert guard.login(other, OPERATOR_KEY) == "ops"  # another peer is not held up
    clock.advance(9.5)
    with pytest.raises(Throttled, match="try again in 1 s"):
        guard.login(stranger, OPERATOR_KEY)
    clock.advance(0.5)
    assert guard.login(stranger, OPERATOR_KEY) == "ops"  # a success forgets the failures
    assert waits_after_wrong_key() == 2
    # Quiet for max_login_wait_s after its wait, a peer starts afresh.
    clock.advance(2 + 10)
    assert waits_after_wrong_key() == 2


def test_the_table_of_failing_peers_is_bounded_by_admin_max_login_peers(clock):
    guard = Guard(settings(max_login_peers=3), clock)
    for n in range(10):
        guard.backoff.failed(f"10.0.0.{n}")
    assert len(guard.backoff) == 3
    assert guard.backoff.wait_s("10.0.0.9") == 1 and guard.backoff.wait_s("10.0.0.0") == 0
    guard.reconfigure(settings(max_login_peers=1))
    assert len(guard.backoff) == 1


def test_local_is_the_configured_networks_and_nothing_else(clock):
    guard = Guard(settings(local=("127.0.0.1/32", "10.0.0.0/8")), clock)
    assert guard.is_local("127.0.0.1") and guard.is_local("10.9.8.7") and guard.is_local("::ffff:127.0.0.1")
    assert not guard.is_local("127.0.0.2") and not guard.is_local("::1") and not guard.is_local(None)
    assert not guard.is_local("unix-socket")


def test_a_reload_that_removes_a_key_ends_its_sessions_and_keeps_the_others(clock):
    from llmgw.config.server import AdminKey

    other = AdminKey("night-shift", hashlib.sha256(b"another key").hexdigest())
    guard = Guard(attrs.evolve(settings(), keys=(*settings().keys, other)), clock)
    ops, night = FakeRequest(), FakeRequest()
    assert guard.login(ops, OPERATOR_KEY) == "ops" and guard.login(night, "another key") == "night-shift"
    guard.reconfigure(attrs.evolve(settings(), keys=(other,)))
    assert guard.operator(ops) is None and guard.operator(night).name == "night-shift"
    # The same name with a new key is a new key: the old key's session ends with it.
    guard.reconfigure(attrs.evolve(settings(), keys=(AdminKey("night-shift", "0" * 64),)))
    assert guard.operator(night) is None


def test_server_yaml_sets_the_page_on_api_and_the_sign_in_backoff(tmp_path):
    from llmgw.config import load_server_config
    from llmgw.errors import ConfigError

    head = "listen: {link: 'ssl:7443'}\ntls: {ca: ca.crt, cert: s.crt, key: s.key}\n"
    path = tmp_path / "server.yaml"
    for name in ("ca.crt", "s.crt", "s.key"):
        (tmp_path / name).write_text("")
    path.write_text(head)
    default = load_server_config(path).admin
    assert (default.on_api, default.login_backoff_s, default.max_login_wait_s, default.max_login_peers) == (True, 1, 300, 4096)
    path.write_text(head + "admin: {on_api: false, local: [], login_backoff_s: 0.5, max_login_wait_s: 30, max_login_peers: 10}\n")
    admin = load_server_config(path).admin
    assert (admin.on_api, admin.local, admin.login_backoff_s, admin.max_login_wait_s, admin.max_login_peers) == (
        False, (), 0.5, 30, 10)
    path.write_text(head + "admin: {max_login_peers: 0}\n")
    with pytest.raises(ConfigError, match="admin.max_login_peers"):
        load_server_config(path)
