"""The servers of one cluster in the dashboard's header: each one's name and role, and the leader's epoch.

Without ``ha:`` there is one server and the header names the hub, as it
always did.  With it, ``llmgw.cp.status`` lists every server
(``FleetStatus.servers``); the header shows them all, the leader with its
epoch, and marks the one this dashboard is connected to.  A dashboard on a
standby sees who leads there: the standby refuses its actions, naming the
leader.
"""

from __future__ import annotations

from rich.text import Text

from llmgw.views import ServerRole, ServerView

ROLE_STYLES = {ServerRole.LEADER: "bold green", ServerRole.STANDBY: "", ServerRole.CAMPAIGNING: "yellow"}
#: The most servers the header names; the rest are counted.
SHOWN = 5


def servers_line(servers: list[ServerView], hub: str) -> Text:
    """The header's tail: the hub alone without ``ha:``; else every server, its role, and the leader's epoch."""
    line = Text()
    if not servers:
        line.append(f"  {hub}", style="dim")
        return line
    for server in servers[:SHOWN]:
        here = server.url is not None and server.url.rstrip("/") == hub.rstrip("/")
        line.append(f"  {server.name}", style="bold" if here else "")
        role = ServerRole(server.role) if server.role in {r.value for r in ServerRole} else None
        words = role.value if role is not None else "-"
        if role is ServerRole.LEADER and server.epoch is not None:
            words += f" (epoch {server.epoch})"
        line.append(f" {words}", style=ROLE_STYLES.get(role, "dim") if role is not None else "dim")
        if here:
            line.append(" ← this hub", style="dim")
    if len(servers) > SHOWN:
        line.append(f"  and {len(servers) - SHOWN} more", style="dim")
    return line
