"""The cluster page's servers (server.yaml's ``ha:``): each one's role and epoch, and on a standby who leads.

``llmgw.cp.status`` lists every server (``FleetStatus.servers``); without
``ha:`` the list is empty and the page shows nothing of it.  A standby's
page says first that it stands by and names the leader with its URLs:
the standby refuses drains, cordons and the rest (its control plane
answers ``llmgw.error.standby``), and its fleet is empty until it leads.
"""

from __future__ import annotations

import time

from twisted.web.template import Tag, tags

from llmgw.admin.pages import cell, table
from llmgw.render import age
from llmgw.views import ServerRole, ServerView


def role_of(server: ServerView) -> ServerRole | None:
    return ServerRole(server.role) if server.role in {r.value for r in ServerRole} else None


def standby_notice(servers: list[ServerView], here: str | None) -> Tag | str:
    """On a standby (or a server campaigning), what it is and where to act instead; '' on the leader."""
    me = next((s for s in servers if s.name == here), None)
    if me is None or role_of(me) is ServerRole.LEADER:
        return ""
    leader = next((s for s in servers if role_of(s) is ServerRole.LEADER), None)
    if leader is None:
        return tags.p(f"{me.name} is not leading, and no server leads just now (an election is under way, or etcd "
                      "does not answer): nothing can be changed until one does.", class_="notice standby")
    epoch = leader.epoch if leader.epoch is not None else "-"
    act = f"llmgw ctl --hub {leader.url}" if leader.url else f"{leader.name}'s admin page"
    where = (f"{me.name} stands by: {leader.name} leads (epoch {epoch}). Drains, cordons and the other actions are "
             f"refused here; act on the leader ({act}). This server's API serves the leader's endpoint table, and "
             "the fleet below is empty until it leads.")
    return tags.p(where, class_="notice standby")


def servers_section(servers: list[ServerView] | None, error: str | None, here: str | None,
                    now: float | None = None) -> Tag | str:
    """Every server, its role, epoch, URLs and how long it has had its role; '' without ``ha:``."""
    if error is not None:
        return tags.section(tags.h2("Servers"), tags.p(f"the servers could not be listed: {error}", class_="error"))
    if not servers:
        return ""
    now = time.time() if now is None else now
    rows = []
    for s in servers:
        role = role_of(s)
        name = [tags.strong(s.name), " (this server)"] if s.name == here else s.name
        rows.append(tags.tr(
            tags.td(name, **{"data-label": "server"}), cell("role", role.value if role is not None else None),
            cell("epoch", s.epoch), cell("hub", s.url), cell("API", s.api_url),
            cell("for", age(max(0.0, now - s.since)) if s.since is not None else None)))
    return tags.section(tags.h2(f"Servers ({len(servers)})"),
                        table(("server", "role", "epoch", "hub", "API", "for"), rows, "no server is listed"))
