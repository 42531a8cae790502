"""The page as llmgw-server serves it from server.yaml's admin: section (and a reload of it), asked from 127.0.0.2."""

from __future__ import annotations

import hashlib
import http.client
import re
from http.cookies import SimpleCookie
from urllib.parse import urlencode

import pytest

from tests.admin.conftest import OPERATOR_KEY, raw

pytestmark = pytest.mark.integration


class From:
    """Requests from *source* to one listener, keeping cookies."""

    def __init__(self, port: int, source: str):
        self.port, self.source, self.jar = port, source, {}

    def request(self, method: str, path: str, form: dict | None = None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10, source_address=(self.source, 0))
        headers = {"cookie": "; ".join(f"{k}={v}" for k, v in self.jar.items())} if self.jar else {}
        body = None
        if form is not None:
            body = urlencode(form)
            headers["content-type"] = "application/x-www-form-urlencoded"
        try:
            conn.request(method, path, body, headers)
            answer = conn.getresponse()
            text = answer.read().decode()
            for line in answer.headers.get_all("set-cookie") or []:
                for name, morsel in SimpleCookie(line).items():
                    self.jar[name] = morsel.value
            return answer.status, text
        finally:
            conn.close()


def token(page: str) -> str:
    return re.search(r'name="csrf" value="([0-9a-f]+)"', page).group(1)


def test_beyond_admin_local_the_server_asks_for_an_operator_key_on_both_listeners(cluster):
    sha = hashlib.sha256(OPERATOR_KEY.encode()).hexdigest()
    cluster.write_server_config(f"admin: {{local: [127.0.0.1/32], keys: [{{name: ops, sha256: {sha}}}]}}\n")
    cluster.start_server()
    cluster.start_agent("node01")
    cluster.wait_node("node01", "ready")
    assert "node01" in From(cluster.admin_port, "127.0.0.1").request("GET", "/")[1]  # local: no key
    # Under /admin on the API listener, which a proxy on this host may face, loopback is nobody special.
    code, page = From(cluster.api_port, "127.0.0.1").request("GET", "/admin/")
    assert code == 401 and "node01" not in page and "everyone signs in" in page
    for port, base in ((cluster.admin_port, ""), (cluster.api_port, "/admin")):
        stranger = From(port, "127.0.0.2")
        code, page = stranger.request("GET", base + "/")
        assert code == 401 and "node01" not in page and "operator key" in page
        code, _ = stranger.request("POST", base + "/login", {"key": OPERATOR_KEY})
        assert code == 403  # no CSRF token: refused before the key is looked at
        code, _ = stranger.request("POST", base + "/login", {"csrf": token(page), "key": OPERATOR_KEY})
        assert code == 303
        code, page = stranger.request("GET", base + "/")
        assert code == 200 and "node01" in page and "operator: ops" in page
        code, page = stranger.request("POST", base + "/action", {"node": "node01", "action": "cordon"})
        assert code == 403
    assert cluster.nodes()["node01"]["cordoned"] is False

    # A reload that drops the key ends its sessions at once; one that makes 127.0.0.2 local lets it in.
    cluster.write_server_config("admin: {local: [127.0.0.1/32]}\n")
    assert cluster.ctl("reload").returncode == 0
    assert stranger.request("GET", "/admin/")[0] == 401
    cluster.write_server_config("admin: {local: [127.0.0.0/8]}\n")
    assert cluster.ctl("reload").returncode == 0
    code, page = From(cluster.admin_port, "127.0.0.2").request("GET", "/")
    assert code == 200 and "local: 127.0.0.2" in page


def test_admin_on_api_false_leaves_admin_on_the_api_listener_to_the_router(cluster):
    cluster.write_server_config("admin: {on_api: false}\n")
    cluster.start_server()
    code, page = From(cluster.api_port, "127.0.0.1").request("GET", "/admin/")
    assert code == 404 and "sign in" not in page and "<html" not in page
    code, page = From(cluster.admin_port, "127.0.0.1").request("GET", "/")
    assert code == 200 and "local: 127.0.0.1" in page


def test_a_page_that_rebinds_its_name_to_the_admin_listener_reads_nothing_and_cordons_nothing(cluster):
    # DNS rebinding: the operator's browser, on the server's host, runs a page whose name now points at
    # 127.0.0.1.  Its requests come from 127.0.0.1 (admin.local) and name the page's own host.
    cluster.start_server()
    cluster.start_agent("node01")
    cluster.wait_node("node01", "ready")
    port = cluster.admin_port
    browser = From(port, "127.0.0.1")
    form = urlencode({"csrf": token(browser.request("GET", "/confirm?node=node01&action=cordon")[1]),
                      "node": "node01", "action": "cordon"})
    cookie = "; ".join(f"{k}={v}" for k, v in browser.jar.items())

    def ask(host: str, target: str = "/", method: str = "GET", origin: str | None = None):
        head = f"{method} {target} HTTP/1.1\nHost: {host}\nConnection: close\nCookie: {cookie}"
        if method == "POST":
            head += f"\nOrigin: {origin}\nContent-Type: application/x-www-form-urlencoded\nContent-Length: {len(form)}"
        return raw(port, head, form.encode() if method == "POST" else b"")

    rebound = f"rebind.attacker.example:{port}"
    for target in ("/", "/node?id=node01", "/logs.json?node=node01", "/confirm?node=node01&action=cordon", "/metrics"):
        answer = ask(rebound, target)
        assert answer.code == 421 and "node01" not in answer.body and "admin.hosts" in answer.body, target
    assert ask(rebound, "/action", "POST", f"http://{rebound}").code == 421
    assert ask(f"localhost:{port}", "/action", "POST", f"http://localhost:{port}").code == 403  # token drawn under 127.0.0.1
    assert cluster.nodes()["node01"]["cordoned"] is False
    assert ask(f"127.0.0.1:{port}", "/action", "POST", f"http://127.0.0.1:{port}").code == 303
    assert cluster.nodes()["node01"]["cordoned"] is True

    # A name of the server's own is listed in admin.hosts; a reload applies it (and the list replaces the defaults).
    cluster.write_server_config("admin: {hosts: [gw01.test]}\n")
    assert cluster.ctl("reload").returncode == 0
    answer = ask(f"gw01.test:{port}")
    assert answer.code == 200 and "node01" in answer.body
    assert ask(f"localhost:{port}").code == 421 and ask(f"127.0.0.1:{port}", "/metrics").code == 200
