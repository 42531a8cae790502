"""The dashboard's header names every server (ha:), its role and the leader's epoch, and follows a failover."""

from __future__ import annotations

import pytest

from llmgw.tui.app import DashboardApp
from llmgw.tui.servers import servers_line
from llmgw.views import ServerRole, ServerView

from .tui_helpers import screen_text, small_fleet, until


HERE = "fake://fleet"  # the fake backend's hub


def server(name, role, epoch=None, url=None):
    return ServerView(name, role, url or f"wss://{name}.example:7443/", None, epoch, 1000.0)


@pytest.mark.asyncio(loop_scope="session")
async def test_the_header_shows_every_server_its_role_and_the_leaders_epoch_and_follows_a_failover():
    fake = small_fleet()
    fake.server_views = [server("serverA", ServerRole.LEADER, 7), server("serverB", ServerRole.STANDBY, url=HERE)]
    app = DashboardApp(fake, servers_poll_s=0.05)
    async with app.run_test(size=(160, 30)) as pilot:
        await until(pilot, lambda: "serverA leader (epoch 7)" in screen_text(app), "the leader in the header")
        assert "serverB standby ← this hub" in screen_text(app)
        assert HERE not in screen_text(app).splitlines()[0]  # the servers say it, not the hub's URL
        # serverA is killed; serverB leads with a newer epoch, and serverA's entry lapses.
        fake.server_views = [server("serverB", ServerRole.LEADER, 8, url=HERE)]
        await until(pilot, lambda: "serverB leader (epoch 8) ← this hub" in screen_text(app), "the new leader")
        assert "serverA" not in screen_text(app)


@pytest.mark.asyncio(loop_scope="session")
async def test_without_ha_the_header_names_the_hub_as_before():
    app = DashboardApp(small_fleet(), servers_poll_s=0.05)
    async with app.run_test(size=(160, 30)) as pilot:
        await until(pilot, lambda: HERE in screen_text(app), "the hub in the header")
        assert "leader" not in screen_text(app).splitlines()[0]


def test_a_server_without_a_known_role_shows_a_dash_and_many_servers_are_counted():
    line = servers_line([server("s1", None), *[server(f"s{i}", ServerRole.STANDBY) for i in range(2, 8)]], HERE)
    assert line.plain == "  s1 -  s2 standby  s3 standby  s4 standby  s5 standby  and 2 more"
    assert servers_line([server("s1", ServerRole.CAMPAIGNING)], HERE).plain == "  s1 campaigning"
