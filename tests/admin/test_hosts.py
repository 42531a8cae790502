"""DNS rebinding and its kin: a browser tricked into asking this listener for another host's page gets nothing.

A page at ``rebind.attacker.example`` re-points its name at 127.0.0.1; the
operator's browser then sends it the admin page's answers, from 127.0.0.1,
with ``Host: rebind.attacker.example``.  Each request here is written byte
for byte (``raw``), so the Host, Origin and target are exactly the hostile ones.
"""

from __future__ import annotations

import socket
from urllib.parse import urlencode, urlsplit

import pytest
import pytest_twisted
from twisted.internet import threads

from tests.admin.conftest import Client, raw, settings

pytestmark = pytest.mark.filterwarnings("ignore:Using readBody with a transport:DeprecationWarning")

READS = ("/", "/login", "/node?id=gpu01", "/logs.json?node=gpu01", "/confirm?node=gpu01&action=drain",
         "/replica?id=qwen/0", "/progress.json", "/metrics", "/static/admin.js")


def port_of(admin) -> int:
    return urlsplit(admin.url).port


async def ask(admin, host: str | None, target: str = "/", method: str = "GET", headers: str = "",
              body: bytes = b"", source: str = "127.0.0.1", version: str = "HTTP/1.1"):
    lines = [f"{method} {target} {version}", *([f"Host: {host}"] if host is not None else []), "Connection: close"]
    if body:
        lines += ["Content-Type: application/x-www-form-urlencoded", f"Content-Length: {len(body)}"]
    head = "\n".join(lines) + ("\n" + headers.strip() if headers.strip() else "")
    return await threads.deferToThread(raw, port_of(admin), head, body, source)


async def signed_form(admin, action: str = "drain") -> tuple[str, bytes]:
    """A browser's CSRF cookie and a form carrying its token, drawn under ``Host: 127.0.0.1:PORT``."""
    client = Client(admin.url)
    token = (await client.get(f"/confirm?node=gpu01&action={action}")).csrf()
    cookie = "; ".join(f"{k}={v}" for k, v in client.jar.items())
    return cookie, urlencode({"csrf": token, "node": "gpu01", "action": action}).encode()


@pytest_twisted.ensureDeferred
async def test_a_local_peer_asking_for_a_name_that_is_not_this_servers_gets_421_and_nothing_else(admin, source):
    port = port_of(admin)
    for host in (f"rebind.attacker.example:{port}", "rebind.attacker.example", f"localhost.attacker.example:{port}",
                 f"127.0.0.1.nip.io:{port}", "LOCALHOST.Attacker.Example.", f"xn--lcalhost-9za:{port}"):
        for target in READS:
            answer = await ask(admin, host, target)
            assert answer.code == 421, (host, target, answer.code)
            assert "gpu01" not in answer.body and "qwen" not in answer.body, (host, target)
            assert answer.header("set-cookie") is None, (host, target)  # no CSRF cookie, no token
            assert "add it to admin.hosts in server.yaml" in answer.body, (host, target)
        # Even with a real browser's cookie and token, what the rebound page posts changes nothing.
        cookie, form = await signed_form(admin)
        name = host.split(":")[0]
        posted = await ask(admin, host, "/action", "POST", f"Cookie: {cookie}\nOrigin: http://{name}:{port}", form)
        assert posted.code == 421, host
        # What a proxy would say about the host is nobody's word here.
        assert (await ask(admin, host, "/", headers=f"X-Forwarded-Host: localhost:{port}")).code == 421, host
    assert source.acted == []


@pytest_twisted.ensureDeferred
async def test_this_servers_own_names_and_any_address_are_answered_whatever_the_port(admin):
    port = port_of(admin)
    # Its names with and without a port, in any case, with a trailing dot; the port an ssh tunnel gives
    # (localhost:8080 for this listener) is not compared.
    for host in (f"127.0.0.1:{port}", "127.0.0.1", f"localhost:{port}", f"LocalHost:{port}", f"localhost.:{port}",
                 "localhost:8080", f"[::1]:{port}", "[::1]", f"{socket.gethostname()}:{port}", f"10.0.0.5:{port}"):
        page = await ask(admin, host)
        assert page.code == 200 and "gpu01" in page.body, host
        assert (await ask(admin, host, "/metrics")).code == 200, host


@pytest_twisted.ensureDeferred
async def test_a_request_naming_no_host_two_hosts_a_malformed_one_or_a_url_is_refused(admin, source):
    port = port_of(admin)
    cookie, form = await signed_form(admin)
    for source_address in ("127.0.0.1", "127.0.0.2"):
        for target in READS:
            assert (await ask(admin, None, target, version="HTTP/1.0", source=source_address)).code == 400, target
            two = await ask(admin, f"127.0.0.1:{port}", target, headers="Host: rebind.attacker.example",
                            source=source_address)
            assert two.code == 400 and "one Host header" in two.body, target
        for host in (f"localhost:{port}:{port}", "localhost:99999", "localhost:http", "local host", "[::1",
                     "[localhost]:80", f"rebind.attacker.example@127.0.0.1:{port}", "", "a..b", "-a", "é.example",
                     f"127.0.0.1:{port}, rebind.attacker.example", "localhost\trebind.attacker.example"):
            answer = await ask(admin, host, source=source_address)
            assert answer.code == 400 and "Host header is not a host" in answer.body and "gpu01" not in answer.body, host
    # A URL for a target names a second host: only a proxy is sent those.
    for target in ("http://rebind.attacker.example/", f"http://127.0.0.1:{port}/", f"http://127.0.0.1:{port}/metrics"):
        answer = await ask(admin, f"127.0.0.1:{port}", target)
        assert answer.code == 400 and "not a URL" in answer.body and "gpu01" not in answer.body, target
    answer = await ask(admin, f"127.0.0.1:{port}", "http://rebind.attacker.example/action", "POST",
                       f"Cookie: {cookie}\nOrigin: http://127.0.0.1:{port}", form)
    assert answer.code == 400 and source.acted == []


@pytest_twisted.ensureDeferred
async def test_admin_hosts_is_the_list_of_names_and_a_reload_changes_it(admin):
    port = port_of(admin)
    admin.page.reconfigure(settings(hosts=("gw01.example.com",)))
    for host in ("gw01.example.com", f"GW01.example.COM.:{port}", "10.0.0.5"):
        assert (await ask(admin, host)).code == 200, host
    refused = await ask(admin, f"localhost:{port}")  # the list replaces the default names
    assert refused.code == 421
    assert "localhost is not a name of this server's admin listener (an IP address always is)" in refused.body
    # A rebound page reads the 421: it names none of the listener's names.
    assert "gw01" not in refused.body and "gw01" not in (await ask(admin, "rebind.attacker.example")).body
    admin.page.reconfigure(settings(hosts=()))
    assert (await ask(admin, "gw01.example.com")).code == 421 and (await ask(admin, "127.0.0.1")).code == 200
    admin.page.reconfigure(settings())
    assert (await ask(admin, f"localhost:{port}")).code == 200


@pytest_twisted.ensureDeferred
async def test_a_peer_that_signs_in_may_ask_for_any_name_but_metrics_may_not(admin):
    # Beyond admin.local nobody gets in without a key, and a browser sends a session cookie only to the
    # name that set it, so a rebound name finds a sign-in form: no 421 that would shut out an operator's
    # own DNS name for the server.
    for host in ("gw.corp.example", "rebind.attacker.example"):
        answer = await ask(admin, host, source="127.0.0.2")
        assert answer.code == 401 and "operator key" in answer.body and "gpu01" not in answer.body, host
        # /metrics answers whoever reaches it: only for this server's names.
        assert (await ask(admin, host, "/metrics", source="127.0.0.2")).code == 421, host
        # /healthz says nothing but "ok", to whatever host a load balancer's check names (or none).
        health = await ask(admin, host, "/healthz", source="127.0.0.2")
        assert health.code == 200 and health.body == "ok\n", host
    assert (await ask(admin, None, "/healthz", version="HTTP/1.0")).body == "ok\n"
    assert (await ask(admin, "127.0.0.1", "/metrics", source="127.0.0.2")).code == 200


@pytest_twisted.ensureDeferred
async def test_a_form_is_refused_unless_everything_the_browser_says_names_this_page(admin, source):
    port = port_of(admin)
    cookie, form = await signed_form(admin, "cordon")
    host = f"127.0.0.1:{port}"
    for says in ("Origin: null", f"Origin: http://127.0.0.1:{port + 1}", f"Origin: http://localhost:{port}",
                 f"Origin: http://rebind.attacker.example:{port}", "Origin: http://127.0.0.1",
                 f"Origin: http://evil@127.0.0.1:{port}", "Origin: not a url", "Origin: ",
                 "Referer: http://rebind.attacker.example/page",
                 f"Referer: http://127.0.0.1:{port + 1}/",
                 "Sec-Fetch-Site: cross-site", "Sec-Fetch-Site: same-site",  # another port on this host is same-site
                 f"Origin: http://127.0.0.1:{port}\nSec-Fetch-Site: cross-site"):
        refused = await ask(admin, host, "/action", "POST", f"Cookie: {cookie}\n{says}", form)
        assert refused.code == 403 and "CSRF" in refused.body, says
    assert source.acted == []
    for says in (f"Origin: http://127.0.0.1:{port}", f"Origin: HTTP://127.0.0.1:{port}",
                 f"Referer: http://127.0.0.1:{port}/confirm?node=gpu01&action=cordon",
                 f"Origin: http://127.0.0.1:{port}\nSec-Fetch-Site: same-origin",
                 ""):  # a client that is not a browser says nothing: the token decides
        done = await ask(admin, host, "/action", "POST", f"Cookie: {cookie}\n{says}", form)
        assert done.code == 303, says
    assert source.acted == [("cordon", "gpu01")] * 5


@pytest_twisted.ensureDeferred
async def test_a_csrf_token_drawn_under_one_name_is_no_good_under_another(admin, source):
    port = port_of(admin)
    cookie, form = await signed_form(admin)  # drawn under 127.0.0.1:PORT
    for host in (f"localhost:{port}", "127.0.0.1", f"[::1]:{port}"):
        origin = f"http://{host}"
        refused = await ask(admin, host, "/action", "POST", f"Cookie: {cookie}\nOrigin: {origin}", form)
        assert refused.code == 403 and "CSRF" in refused.body, host
    assert source.acted == []
    done = await ask(admin, f"127.0.0.1:{port}", "/action", "POST", f"Cookie: {cookie}\nOrigin: http://127.0.0.1:{port}",
                     form)
    assert done.code == 303 and source.acted == [("drain", "gpu01")]


def test_server_yaml_admin_hosts_is_names_absent_is_the_defaults(tmp_path):
    from llmgw.hostnames import HostNames
    from llmgw.config import load_server_config
    from llmgw.errors import ConfigError

    head = "listen: {link: 'ssl:7443'}\ntls: {ca: ca.crt, cert: s.crt, key: s.key}\n"
    path = tmp_path / "server.yaml"
    for name in ("ca.crt", "s.crt", "s.key"):
        (tmp_path / name).write_text("")
    path.write_text(head)
    assert load_server_config(path).admin.hosts is None
    assert HostNames.from_setting(None).names == tuple(dict.fromkeys(("localhost", socket.gethostname().lower())))
    path.write_text(head + "admin: {hosts: [GW01.Example.com., localhost]}\n")
    assert load_server_config(path).admin.hosts == ("gw01.example.com", "localhost")
    path.write_text(head + "admin: {hosts: []}\n")
    assert load_server_config(path).admin.hosts == ()
    for bad in ("'http://gw01'", "'gw01:9090'", "'*.example.com'", "''", "'gw 01'"):
        path.write_text(head + f"admin: {{hosts: [{bad}]}}\n")
        with pytest.raises(ConfigError, match=r"admin\.hosts.*not a host name; write it like 'gw01.example.com'"):
            load_server_config(path)


def test_the_guard_itself_trusts_a_local_peer_only_when_it_asks_for_this_servers_name(clock):
    # The page answers 421 first; the guard does not lean on that.
    from twisted.internet.address import IPv4Address
    from twisted.web.test.requesthelper import DummyRequest

    from llmgw.admin.auth import Guard

    guard = Guard(settings(), clock)

    def request(*hosts: str):
        made = DummyRequest([b""])
        made.uri, made.client, made.getCookie = b"/", IPv4Address("TCP", "127.0.0.1", 40000), lambda name: None
        if hosts:
            made.requestHeaders.setRawHeaders(b"host", [h.encode() for h in hosts])
        return made

    assert guard.operator(request("127.0.0.1:9090")).local and guard.operator(request("localhost")).local
    for hosts in (("rebind.attacker.example:9090",), (), ("localhost", "rebind.attacker.example")):
        assert guard.operator(request(*hosts)) is None, hosts
    assert guard.operator(request("rebind.attacker.example"), trust_local=False) is None


@pytest_twisted.ensureDeferred
async def test_metrics_spelled_otherwise_is_held_to_the_same_names(admin):
    for target, method in (("/%6detrics", "GET"), ("/metrics/", "GET"), ("/metrics", "HEAD"), ("/metrics?x=1", "GET")):
        answer = await ask(admin, "rebind.attacker.example", target, method)
        assert answer.code == 421 and "llmgw_" not in answer.body, (target, method)
