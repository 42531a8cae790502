"""Real processes: llmgw-router's admin listener and key-less API, and llmgw-server's key-less API, answer only their names.

/metrics names every API key that has been used, and answers whoever
reaches ``listen.admin``: a page whose DNS name is re-pointed at 127.0.0.1
must not read it through an operator's browser.  router.yaml's
``admin.hosts`` lists the names (absent: ``localhost`` and the host name);
an IP address is always answered; ``/healthz`` answers any name.  A
key-less API answers ``router.hosts``, from server.yaml (a reload applies
it) or router.yaml (read at start).
"""

from __future__ import annotations

import hashlib
import json
import socket

import pytest

from tests.admin.conftest import raw
from tests.support.cluster import Process, cluster, environment, twistd  # noqa: F401 - fixture
from tests.support.net import free_port
from tests.support.sim import MODEL
from tests.support.wait import wait_for

KEY_NAME = "payroll-batch"
TOKEN = "sk-llmgw-process-names"
CHAT = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).encode()


def ask(port: int, host: str | None, target: str = "/metrics", method: str = "GET", more: str = "",
        body: bytes = b"") -> tuple[int, str]:
    lines = [f"{method} {target} HTTP/1.1", *([f"Host: {host}"] if host is not None else []), "Connection: close"]
    if body:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    answer = raw(port, "\n".join(lines + [more]), body)
    return answer.code, answer.body


@pytest.fixture
def router_process(tmp_path, sim):
    """start(router.yaml's text after listen:) -> (api port, admin port) of a running llmgw-router."""
    started: list[Process] = []

    def start(extra: str = "") -> tuple[int, int]:
        api, admin = free_port(), free_port()
        config = tmp_path / f"router{len(started)}.yaml"
        config.write_text(f"""
listen: {{api: "tcp:{api}:interface=127.0.0.1", admin: "tcp:{admin}:interface=127.0.0.1"}}
router:
  endpoints: [{{model: {MODEL}, url: "{sim.base_url}"}}]
{extra}""")
        proc = Process("router", twistd("llmgw-router", config), tmp_path / f"router{len(started)}.log",
                       environment()).start()
        started.append(proc)

        def up():
            assert proc.running(), proc.output()
            try:
                return ask(admin, "127.0.0.1", "/healthz")[0] == 200 and ask(api, "127.0.0.1", "/v1/models")[0] in (200, 401)
            except OSError:
                return False

        wait_for(up, 30, "llmgw-router to listen", detail=proc.output)
        return api, admin

    yield start
    for proc in started:
        proc.stop()


def test_the_router_process_holds_metrics_to_its_names(router_process):
    sha = hashlib.sha256(TOKEN.encode()).hexdigest()
    api, admin = router_process(f"  keys: [{{name: {KEY_NAME}, sha256: {sha}}}]\n")
    status, _ = ask(api, "127.0.0.1", "/v1/chat/completions", "POST", f"Authorization: Bearer {TOKEN}", CHAT)
    assert status == 200
    # From an own name or an address the scrape has the key's name ...
    for host in (f"127.0.0.1:{admin}", "127.0.0.1", f"localhost:{admin}", f"{socket.gethostname()}:{admin}",
                 f"[::1]:{admin}"):
        status, body = ask(admin, host)
        assert status == 200 and KEY_NAME in body, host
    # ... and from a rebound name it has nothing, on every path but /healthz.
    for host in (f"rebind.attacker.example:{admin}", "rebind.attacker.example", "LOCALHOST.attacker.example."):
        for target in ("/metrics", "/metrics/", "/%6detrics", "/metrics?x=1", "/"):
            status, body = ask(admin, host, target)
            assert status == 421 and KEY_NAME not in body and "llmgw_" not in body, (host, target, status)
            assert "add it to admin.hosts in router.yaml and restart llmgw-router" in body, (host, target)
        status, body = ask(admin, host, "/healthz")
        assert status == 200 and body == "ok\n"
    for host, more in ((None, ""), (f"127.0.0.1:{admin}", "Host: rebind.attacker.example"), ("a..b", "")):
        status, body = ask(admin, host, more=more)
        assert status == 400 and KEY_NAME not in body, (host, more)
    # An API with keys is not held to names: a browser sends no bearer token by itself.
    status, body = ask(api, "rebind.attacker.example", "/v1/models")
    assert status == 401 and MODEL not in body


def test_router_yaml_admin_hosts_and_router_hosts_name_the_process(router_process):
    # router.hosts under router:, admin.hosts at the top.
    api, admin = router_process("  hosts: [llm.example.com]\nadmin: {hosts: [metrics.example.com]}\n")
    assert ask(admin, "metrics.example.com")[0] == 200
    assert ask(admin, "10.1.2.3:9091")[0] == 200
    status, body = ask(admin, f"localhost:{admin}")  # the list replaces the defaults
    assert status == 421 and "localhost is not a name of this router's admin listener (an IP address always" in body
    assert "metrics.example" not in body  # a rebound page reads the 421: it learns none of the names
    # The key-less API: its own names only, and router.yaml's words for the fix.
    assert ask(api, "llm.example.com", "/v1/models")[0] == 200
    status, body = ask(api, "rebind.attacker.example", "/v1/models")
    assert status == 421 and MODEL not in body
    assert "add it to router.hosts in router.yaml and restart llmgw-router" in json.loads(body)["error"]["message"]


@pytest.mark.integration
def test_the_servers_keyless_api_answers_router_hosts_and_a_reload_changes_them(cluster):
    cluster.write_server_config("")
    cluster.start_server()
    api = cluster.api_port
    status, body = ask(api, f"rebind.attacker.example:{api}", "/v1/models")
    assert status == 421 and "add it to router.hosts in server.yaml and reload" in json.loads(body)["error"]["message"]
    for host in (f"127.0.0.1:{api}", f"localhost:{api}", f"{socket.gethostname()}:{api}"):
        assert ask(api, host, "/v1/models")[0] == 200, host
    cluster.write_server_config("router: {hosts: [llm.test]}\n")
    assert cluster.ctl("reload").returncode == 0
    assert ask(api, f"llm.test:{api}", "/v1/models")[0] == 200
    assert ask(api, f"localhost:{api}", "/v1/models")[0] == 421 and ask(api, "127.0.0.1", "/v1/models")[0] == 200
    # With keys the API is not held to names: without a key a rebound page's request is 401, /v1/models too.
    sha = hashlib.sha256(TOKEN.encode()).hexdigest()
    cluster.write_server_config(f"router: {{keys: [{{name: {KEY_NAME}, sha256: {sha}}}]}}\n")
    assert cluster.ctl("reload").returncode == 0
    status, body = ask(api, f"rebind.attacker.example:{api}", "/v1/models")
    assert status == 401 and json.loads(body)["error"]["code"] == "invalid_api_key"
    assert ask(api, f"rebind.attacker.example:{api}", "/v1/models", more=f"Authorization: Bearer {TOKEN}")[0] == 200
