"""The cluster page with ha:: every server, its role and epoch; a standby's page says it stands by and names the leader."""

from __future__ import annotations

import pytest
import pytest_twisted

from llmgw.admin.servers import servers_section, standby_notice
from llmgw.views import ServerRole, ServerView
from tests.admin.conftest import Client
from tests.admin.test_pages import section

pytestmark = pytest.mark.filterwarnings("ignore:Using readBody with a transport:DeprecationWarning")

A = ServerView("serverA", ServerRole.LEADER, "wss://a.example:7443/", "http://a.example:8080", 7, 100.0)
B = ServerView("serverB", ServerRole.STANDBY, "wss://b.example:7443/", "http://b.example:8080", None, 160.0)


@pytest_twisted.ensureDeferred
async def test_a_standbys_page_says_it_stands_by_names_the_leader_and_lists_every_server(admin, source):
    source.here, source.server_views = "serverB", [A, B]
    body = (await Client(admin.url).get("/")).body
    assert body.index('class="notice standby"') < body.index("<h2>Servers") < body.index("<h2>Nodes")
    assert ("serverB stands by: serverA leads (epoch 7). Drains, cordons and the other actions are refused here; act "
            "on the leader (llmgw ctl --hub wss://a.example:7443/)") in body
    servers = section(body, "Servers (2)")
    assert '<td data-label="role">leader</td><td data-label="epoch">7</td>' in servers
    assert '<td data-label="role">standby</td><td data-label="epoch">-</td>' in servers
    assert "<strong>serverB</strong> (this server)" in servers and "http://a.example:8080" in servers


@pytest_twisted.ensureDeferred
async def test_the_leaders_page_lists_the_servers_without_a_notice_and_a_page_without_ha_shows_neither(admin, source):
    source.here, source.server_views = "serverA", [A, B]
    body = (await Client(admin.url).get("/")).body
    assert "<h2>Servers (2)" in body and "stands by" not in body
    source.here, source.server_views = None, []
    body = (await Client(admin.url).get("/")).body
    assert "<h2>Servers" not in body and "<h2>Nodes" in body


@pytest_twisted.ensureDeferred
async def test_servers_that_cannot_be_listed_say_why_and_the_page_still_shows(admin, source):
    source.servers_error = "the control plane has not joined the hub yet: reload in a moment"
    body = (await Client(admin.url).get("/")).body
    assert "the servers could not be listed: the control plane has not joined the hub yet" in body
    assert "<h2>Nodes" in body


def test_a_server_campaigning_with_no_leader_says_nothing_can_be_changed_until_one_leads():
    campaigning = ServerView("serverB", ServerRole.CAMPAIGNING, "wss://b.example:7443/", None, None, 1.0)
    notice = standby_notice([campaigning], "serverB")
    assert "no server leads just now" in notice.children[0]
    assert standby_notice([A, B], "serverA") == ""
    assert servers_section([], None, None) == ""
