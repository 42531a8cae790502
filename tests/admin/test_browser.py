"""The admin page in Debian's chromium against a real server, two agents and sim engines on 127.0.0.1.

What a person does: opens the cluster page, watches a download's bar move
(the model file is held at each megabyte until the test has looked), clicks
through to a node and its engine's log, follows it while the engine prints,
and drains a node through the confirmation page and sees its replica move.
Every page is saved at 1280×800 and 390×844 under $LLMGW_TEST_ARTIFACTS
(default build/artifacts/admin/), as the screen shows it and whole
(``-full``).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import urllib.request
import uuid
from pathlib import Path

import pytest
import pytest_twisted

from tests.admin.conftest import OPERATOR_KEY
from tests.support.browser import Browser
from tests.support.cluster import ROOT
from tests.support.modelfile import ModelFile
from tests.support.wait import until_awaited, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.slow]

SIZE = 3_000_000
SIZES = {"desktop": (1280, 800), "phone": (390, 844)}
HOSTILE_PATH = "/v1/models/<script>document.title='pwned'</script>"


#: Under /admin on the API listener everyone signs in, loopback included.
ADMIN = f"admin: {{keys: [{{name: ops, sha256: {hashlib.sha256(OPERATOR_KEY.encode()).hexdigest()}}}]}}\n"


def catalog(url: str, sha256: str) -> str:
    return ADMIN + f"""
profiles:
  sim-fast: {{engine: sim, args: ["--ttft-ms", "0"]}}
models:
  echo: {{profile: sim-fast, replicas: 1}}
  fetched: {{source: "{url}", sha256: "{sha256}", profile: sim-fast, replicas: 1}}
"""


def artifacts() -> Path:
    return Path(os.environ.get("LLMGW_TEST_ARTIFACTS") or ROOT / "build" / "artifacts" / "admin")


def replicas(cluster) -> dict[str, dict]:
    return {r["replica"]: r for r in json.loads(cluster.ctl("replicas", "--json").stdout)}


def raw_get(endpoint: str, path: str) -> None:
    """A request as the bytes a hostile client sends, unescaped, so the engine logs them as they came."""
    host, port = endpoint.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        while s.recv(65536):
            pass


def served_models(api: str) -> list[str]:
    with urllib.request.urlopen(api + "/v1/models", timeout=10) as answer:
        return [m["id"] for m in json.load(answer)["data"]]


async def shoot(browser: Browser, name: str) -> None:
    for size, (width, height) in SIZES.items():
        await browser.screenshot(artifacts() / f"{name}-{size}.png", width, height)
        await browser.screenshot(artifacts() / f"{name}-{size}-full.png", width, height, full=True)
    await browser.viewport(*SIZES["desktop"])


def row(replica: str) -> str:
    return (f"([...document.querySelectorAll('tr')].find(r => r.querySelector('a') && "
            f"r.querySelector('a').textContent === {json.dumps(replica)}) || {{}}).innerText || ''")


@pytest_twisted.ensureDeferred
async def test_an_operator_watches_and_drains_the_fleet_in_a_browser(cluster, chromium, tmp_path):
    model = ModelFile("gemma-test.gguf", os.urandom(SIZE), stops=(1_000_000, 2_000_000)).start()
    browser = None
    try:
        cluster.write_server_config(ADMIN)
        cluster.start_server()
        for node in ("node01", "node02"):
            cluster.start_agent(node)
        for node in ("node01", "node02"):
            cluster.wait_node(node, "ready")
        browser = await Browser.start(chromium, tmp_path)
        await browser.viewport(*SIZES["desktop"])
        await browser.goto(cluster.admin + "/")
        await browser.until("document.body.innerText.includes('node02')", "both nodes on the cluster page")

        # A download held at its first megabyte: the bar shows it, then moves without a reload.
        cluster.write_server_config(catalog(model.url, model.sha256))
        assert cluster.ctl("reload").returncode == 0
        wait_for(lambda: (replicas(cluster).get("fetched/0", {}).get("progress") or {}).get("bytes_done"), 30,
                 "the download to start", interval=0.3)
        await browser.goto(cluster.admin + "/")
        bar = "document.querySelector('progress[data-progress=\"replica:fetched/0\"]')"
        first = await browser.until(f"{bar} && {bar}.value", "a progress bar for the download")
        assert 0 < first <= 1_000_000 and await browser.evaluate(f"{bar}.max") == SIZE
        await shoot(browser, "cluster-fetching")
        await browser.evaluate("window.sameDocument = true")
        model.release()
        moved = await browser.until(f"{bar} && {bar}.value > 1000000 && {bar}.value", "the bar to move")
        assert moved <= 2_000_000 and await browser.evaluate("window.sameDocument") is True
        model.release()
        wait_for(lambda: replicas(cluster).get("fetched/0", {}).get("state") == "ready", 60, "the fetched replica",
                 interval=0.3, detail=cluster.logs)
        echo = wait_for(lambda: (r := replicas(cluster).get("echo/0")) and r["state"] == "ready" and r, 60,
                        "echo/0 to be ready", interval=0.3)
        (host,) = echo["nodes"]
        other = ({"node01", "node02"} - {host}).pop()
        await browser.goto(cluster.admin + "/")
        await browser.until(f"{row('echo/0')}.includes('ready')", "echo/0 ready on the cluster page")
        await shoot(browser, "cluster")

        # Through to the node, its engine's log, and follow mode.
        await browser.click(f"a[href='/node?id={host}']")
        await browser.loaded(f"/node?id={host}")
        await browser.click("a.button[href*='source=echo%2F0%2F0']")
        await browser.loaded("source=echo%2F0%2F0")
        await browser.click("a[href*='follow=1']")
        await browser.loaded("follow=1")
        await browser.evaluate("window.sameDocument = true")
        marker = uuid.uuid4().hex
        raw_get(echo["endpoint"], f"/v1/models/printed-after-the-page-opened-{marker}")
        raw_get(echo["endpoint"], HOSTILE_PATH)
        await browser.until(f"document.querySelector('pre.log').textContent.includes('{marker}')",
                            "the engine's new line to appear in follow mode", timeout=30)
        await browser.until("document.querySelector('pre.log').textContent.includes(\"<script>document.title\")",
                            "the hostile request's line")
        assert await browser.evaluate("window.sameDocument") is True  # followed, not reloaded
        assert await browser.evaluate("document.querySelectorAll('pre.log *').length") == 0
        assert await browser.evaluate("document.title") != "pwned"
        await shoot(browser, "node")
        # Reloaded, the server renders the same line as text too.
        await browser.goto(cluster.admin + f"/node?id={host}&source=echo%2F0%2F0")
        assert "<script>document.title" in await browser.text("pre.log")
        assert await browser.evaluate("document.querySelectorAll('pre.log *').length") == 0

        await browser.goto(cluster.admin + "/replica?id=echo%2F0")
        await browser.until("document.body.innerText.includes('Ranks')", "the replica page")
        assert marker in await browser.text("pre.log")  # rank 0's engine log
        await shoot(browser, "replica")

        # Drain the node through the confirmation page; the replica moves to the other node.
        await browser.goto(cluster.admin + f"/node?id={host}")
        await browser.click("a.button[href*='action=drain']")
        await browser.loaded("/confirm")
        await shoot(browser, "confirm")
        await browser.click("button[type=submit]")
        await browser.loaded("done=", timeout=90)  # the answer comes once the node has stopped its shards
        assert "drain: done" in await browser.text(".notice")
        shown = []

        async def moved():
            await browser.goto(cluster.admin + "/")
            shown[:] = [await browser.evaluate(row("echo/0"))]
            return other in shown[0] and host not in shown[0] and "ready" in shown[0]

        await until_awaited(moved, f"echo/0 to move to {other} on the cluster page", timeout=60, interval=0.5,
                            detail=lambda: f"its row: {shown}\n{cluster.logs()}")
        assert "cordoned" in await browser.evaluate(row(host))
        await shoot(browser, "cluster-drained")

        # Without JavaScript the confirmation works as well: uncordon the drained node.
        await browser.call("Emulation.setScriptExecutionDisabled", value=True)
        await browser.goto(cluster.admin + f"/node?id={host}")
        await browser.click("a.button[href*='action=uncordon']")
        await browser.loaded("/confirm")
        await browser.click("button[type=submit]")
        await browser.loaded("done=")
        assert "uncordon: done" in await browser.text(".notice")
        assert "cordoned" not in await browser.text("table.facts")
        await browser.call("Emulation.setScriptExecutionDisabled", value=False)

        # The same page under /admin on the API listener, and the router still answers beside it.
        await browser.goto(cluster.api + "/admin/login")  # / would say 401, which the console counts as a problem
        await browser.until("document.querySelector('input[name=key]') !== null", "the sign-in form under /admin")
        await browser.evaluate(f"document.querySelector('input[name=key]').value = {json.dumps(OPERATOR_KEY)}")
        await browser.click("button[type=submit]")
        await browser.until(f"{row('echo/0')}.includes({json.dumps(other)})", "the cluster page under /admin")
        assert "operator: ops" in await browser.text("body")
        await browser.click(f"a[href='/admin/node?id={other}']")
        await browser.loaded(f"/admin/node?id={other}")
        assert "echo/0" in await browser.text("main")
        wait_for(lambda: served_models(cluster.api) == ["echo", "fetched"], 30,
                 "the router beside the page to list both models (each once its endpoint is healthy)")
        assert browser.problems == []
    finally:
        if browser is not None:
            await browser.close()
        model.stop()
