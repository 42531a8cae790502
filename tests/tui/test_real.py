"""The dashboard against a real server and real agents on 127.0.0.1, over mutual TLS.

The app runs in this process with ``WampBackend`` — the same autobahn.twisted
client as ``llmgw ctl`` — on Twisted's asyncio reactor, which shares the
session's event loop with Textual and pytest-asyncio.  Blocking harness calls
run in a thread so the dashboard keeps running meanwhile.
"""

from __future__ import annotations

import asyncio

import pytest

from llmgw.huburl import parse_hub_url
from llmgw.tlsfiles import TLSFiles
from llmgw.tui.app import DashboardApp
from llmgw.tui.backend import WampBackend
from llmgw.tui.confirm import ConfirmScreen
from llmgw.tui.details import DetailsScreen
from llmgw.tui.logs import LogPane
from tests.support.modelfile import ModelFile
from tests.support.wait import wait_for

from .tui_helpers import column, rows, screen_text, until

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

CATALOG = """
profiles:
  sim-fast: {engine: sim, args: ["--ttft-ms", "0"]}
models:
  echo: {profile: sim-fast, replicas: 1}
"""
SIZE = (160, 40)


def start_fleet(cluster, nodes=("node01", "node02")) -> None:
    cluster.write_server_config(CATALOG)
    cluster.start_server()
    for node in nodes:
        cluster.start_agent(node)
    for node in nodes:
        cluster.wait_node(node, "ready")


def dashboard(cluster, reactor) -> DashboardApp:
    pki = cluster.pki
    tls = TLSFiles(str(pki / "ca.crt"), str(pki / "alice.crt"), str(pki / "alice.key"))
    return DashboardApp(WampBackend(reactor, parse_hub_url(cluster.hub), tls))


async def test_nodes_and_a_sim_replica_appear_and_a_killed_agent_turns_unreachable(cluster, reactor):
    await asyncio.to_thread(start_fleet, cluster)
    app = dashboard(cluster, reactor)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: column(app, "nodes", "node01", "state") == "ready"
                    and column(app, "nodes", "node02", "state") == "ready", "both nodes ready", timeout=20)
        node01 = dict(zip(["node", "state", "seen", "memory", "gpus", "disk", "engines", "cpu", "address"],
                          rows(app, "nodes")["node01"]))
        assert "free /" in node01["memory"]
        assert "sim" in node01["engines"]
        assert node01["address"] != "-"
        await until(pilot, lambda: column(app, "replicas", "echo/0", "state") == "ready", "echo/0 ready", timeout=60)
        where = column(app, "replicas", "echo/0", "nodes")
        assert where in ("node01", "node02")
        assert column(app, "replicas", "echo/0", "endpoint").startswith("http://127.0.0.1:")

        other = "node02" if where == "node01" else "node01"
        await asyncio.to_thread(cluster.agents[other].kill)
        await until(pilot, lambda: column(app, "nodes", other, "state") == "unreachable",
                    f"{other} to turn unreachable", timeout=20)
        assert column(app, "nodes", where, "state") == "ready"
        await pilot.press("question_mark")  # still answering keys
        await until(pilot, lambda: "drain the node" in screen_text(app), "the keys")


async def test_details_show_the_log_or_say_why_not(cluster, reactor):
    await asyncio.to_thread(start_fleet, cluster, ("node01",))
    app = dashboard(cluster, reactor)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: column(app, "nodes", "node01", "state") == "ready", "node01 ready", timeout=20)
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, DetailsScreen), "the details screen")
        log = app.screen.query_one(LogPane)
        # The control plane relays the agent's own lines (llmgw.cp.logs).
        await until(pilot, lambda: any("registered with the hub" in line for line in log.lines),
                    "the agent's own log lines", timeout=20)


async def test_an_engines_log_lines_appear_as_it_prints_them(cluster, reactor):
    import json
    import urllib.request

    await asyncio.to_thread(start_fleet, cluster, ("node01",))

    def ready_replica():
        views = json.loads(cluster.ctl("replicas", "--json").stdout)
        return next((v for v in views if v["state"] == "ready"), None)

    replica = await asyncio.to_thread(wait_for, ready_replica, 60, "a ready replica")
    app = dashboard(cluster, reactor)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: column(app, "replicas", "echo/0", "state") == "ready", "the replica", timeout=20)
        await pilot.press("tab")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, DetailsScreen), "the replica's details")
        log = app.screen.query_one(LogPane)
        await until(pilot, lambda: any("sim: serving echo" in line for line in log.lines),
                    "the engine's start line", timeout=20)
        body = json.dumps({"model": "echo", "messages": [{"role": "user", "content": "seen in the tui"}]}).encode()
        request = urllib.request.Request(replica["endpoint"] + "/v1/chat/completions", data=body,
                                         headers={"content-type": "application/json"})
        await asyncio.to_thread(lambda: urllib.request.urlopen(request, timeout=10).read())
        await until(pilot, lambda: any("POST /v1/chat/completions" in line for line in log.lines),
                    "the request the engine just logged", timeout=20)


async def test_cordon_and_uncordon_through_the_hub(cluster, reactor):
    await asyncio.to_thread(start_fleet, cluster, ("node01",))
    app = dashboard(cluster, reactor)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: column(app, "nodes", "node01", "state") == "ready", "node01 ready", timeout=20)
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the question")
        await pilot.press("y")
        await until(pilot, lambda: column(app, "nodes", "node01", "state") == "ready,cordoned", "node01 cordoned",
                    timeout=20)
        assert (await asyncio.to_thread(cluster.nodes))["node01"]["cordoned"] is True
        await pilot.press("u")
        await until(pilot, lambda: column(app, "nodes", "node01", "state") == "ready", "node01 uncordoned", timeout=20)


async def test_a_restarted_server_shows_disconnected_then_a_fresh_snapshot(cluster, reactor):
    await asyncio.to_thread(start_fleet, cluster, ("node01",))
    app = dashboard(cluster, reactor)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: column(app, "nodes", "node01", "state") == "ready", "node01 ready", timeout=20)
        await asyncio.to_thread(cluster.server.stop)
        await until(pilot, lambda: "disconnected — reconnecting" in screen_text(app), "the banner", timeout=20)
        await asyncio.to_thread(cluster.start_server)
        await until(pilot, lambda: app.link_problem is None, "the banner to clear", timeout=40)
        # The new control plane knows node01 once its agent has registered again.
        await until(pilot, lambda: column(app, "nodes", "node01", "state") == "ready", "node01 ready again", timeout=30)
        await asyncio.to_thread(wait_for, lambda: cluster.nodes().get("node01"), 10, "ctl to see node01")


async def test_a_downloads_progress_moves_on_the_replicas_pane(cluster, reactor):
    # Held at a third and at two thirds until the pane has shown each.
    served = ModelFile("tui-model.gguf", b"w" * 3_000_000, stops=(1_000_000, 2_000_000)).start()
    try:
        await asyncio.to_thread(start_fleet, cluster, ("node01",))
        app = dashboard(cluster, reactor)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: column(app, "nodes", "node01", "state") == "ready", "node01", timeout=20)
            await pilot.press("tab")  # the replicas pane
            cluster.write_server_config(CATALOG + f'  fetched: {{source: "{served.url}", profile: sim-fast, replicas: 1}}\n')
            assert (await asyncio.to_thread(cluster.ctl, "reload")).returncode == 0
            first = await until(pilot, lambda: "%" in screen_text(app) and _percent(screen_text(app)),
                                "a progress bar on the replicas pane", timeout=30)
            served.release()
            await until(pilot, lambda: (_percent(screen_text(app)) or 0) > first, "the bar to move", timeout=30)
            served.release()
            await until(pilot, lambda: column(app, "replicas", "fetched/0", "state") == "ready",
                        "the replica ready after its download", timeout=60)
    finally:
        served.stop()


def _percent(text: str) -> int | None:
    import re

    found = re.findall(r"(\d+)% ", text)
    return int(found[0]) if found else None
