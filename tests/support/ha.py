"""Two (or more) real servers on one etcd, and agents that know every hub: the failover tests' and bench's fleet.

Each server is ``twistd -n llmgw-server`` in its own directory (its own
journal), with its own ports and ``ha.name``, the same catalog and the same
CA (tests/support/cluster.py's certificates).  Agents are given every
server's hub URL, in the servers' order.  Everything waits for a condition
with a deadline; nothing sleeps in the hope that something has happened.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from llmgw.agent.procs import marked_processes
from tests.support.cluster import Cluster, Process, environment, twistd
from tests.support.net import free_port, listening
from tests.support.wait import wait_for

#: Short, so a failover is seconds: the lease, and how a node goes unreachable and lost.
LEASE_S = 4
FLEET = "fleet: {unreachable_after_s: 3, lost_after_s: 6, settle_s: 3, settle_quiet_s: 2}\n"


class HAServer:
    def __init__(self, fleet: HAFleet, name: str):
        self.fleet, self.name = fleet, name
        self.home = fleet.base / name
        self.home.mkdir(parents=True, exist_ok=True)
        self.link_port, self.api_port, self.admin_port = free_port(), free_port(), free_port()
        self.hub = f"wss://127.0.0.1:{self.link_port}/"
        self.api = f"http://127.0.0.1:{self.api_port}"
        self.proc: Process | None = None

    def write_config(self, catalog: str) -> Path:
        pki = self.fleet.cluster.pki
        path = self.home / "server.yaml"
        etcd = ", ".join(f'"{url}"' for url in self.fleet.etcd_urls)
        path.write_text(f"""listen:
  link: "ssl:{self.link_port}:interface=127.0.0.1"
  api: "tcp:{self.api_port}:interface=127.0.0.1"
  admin: "tcp:{self.admin_port}:interface=127.0.0.1"
tls: {{ca: {pki}/ca.crt, cert: {pki}/llmgw-server.crt, key: {pki}/llmgw-server.key}}
{FLEET}ha:
  etcd: [{etcd}]
  name: {self.name}
  advertise: "{self.hub}"
  api_advertise: "{self.api}"
  lease_s: {LEASE_S}
  request_timeout_s: 1
{catalog}""")
        return path

    def start(self, catalog: str) -> Process:
        config = self.write_config(catalog)
        self.proc = Process(self.name, twistd("llmgw-server", config), self.home / "server.log", environment()).start()
        self.fleet.cluster.processes.append(self.proc)
        ports = (self.link_port, self.api_port, self.admin_port)
        wait_for(lambda: all(listening(p) for p in ports) or not self.proc.running(), 30,
                 f"{self.name}'s listeners to listen")
        assert self.proc.running(), f"{self.name} exited:\n{self.proc.output()}"
        return self.proc

    def ctl(self, *args: str, timeout: float = 30):
        return self.fleet.cluster.ctl(*args, hub=self.hub, timeout=timeout)

    def ctl_json(self, *args: str):
        out = self.ctl(*args, "--json")
        assert out.returncode == 0, f"{self.name}: ctl {' '.join(args)}: {out.stderr}"
        return json.loads(out.stdout)

    def servers(self) -> dict[str, dict]:
        """Every server as this one's ``ctl status`` lists it, by name; {} when it does not answer."""
        out = self.ctl("status", "--json", timeout=10)
        if out.returncode != 0:
            return {}
        return {s["name"]: s for s in json.loads(out.stdout).get("servers", [])}

    def role(self) -> str | None:
        return self.servers().get(self.name, {}).get("role")

    def nodes(self) -> dict[str, dict]:
        out = self.ctl("nodes", "--json", timeout=10)
        return {n["id"]: n for n in json.loads(out.stdout)} if out.returncode == 0 else {}


class HAFleet:
    """Servers named serverA, serverB... on the etcd at *etcd_urls*, and agents dialling them in that order."""

    def __init__(self, cluster: Cluster, etcd_urls: list[str], names=("serverA", "serverB")):
        self.cluster = cluster
        self.base = cluster.base
        self.etcd_urls = etcd_urls
        self.servers = {name: HAServer(self, name) for name in names}

    def start_agent(self, node: str) -> Process:
        config = self.cluster.agent_config(node)
        hubs = ", ".join(f'"{s.hub}"' for s in self.servers.values())
        text = config.read_text().splitlines()
        config.write_text("\n".join(f"hub: [{hubs}]" if line.startswith("hub:") else line for line in text) + "\n")
        proc = Process(node, twistd("llmgw-agent", config), config.parent / "agent.log", environment()).start()
        self.cluster.agents[node] = proc
        self.cluster.processes.append(proc)
        return proc

    def leader(self, among=None) -> HAServer | None:
        """The server that says it leads (asked of each running one in *among*), or None."""
        for server in among or self.servers.values():
            if server.proc is not None and server.proc.running() and server.role() == "leader":
                return server
        return None

    def wait_leader(self, among=None, timeout: float = 30) -> HAServer:
        return wait_for(lambda: self.leader(among), timeout, "a server to lead", interval=0.2, detail=self.cluster.logs)

    def engine_pids(self) -> dict[str, set[int]]:
        """Each agent's engines' pids, from its state directory's marker."""
        return {node: {p.pid for p in marked_processes(self.cluster.base / node / "state")}
                for node in self.cluster.agents}

    def wait_ready(self, server: HAServer, model: str, count: int, timeout: float = 60) -> list[dict]:
        def check():
            found = [r for r in server.ctl_json("replicas") if r["model"] == model and r["state"] == "ready"]
            return found if len(found) == count else None
        return wait_for(check, timeout, f"{count} ready replica(s) of {model} on {server.name}", interval=0.3,
                        detail=self.cluster.logs)

    def wait_nodes_ready(self, server: HAServer, nodes, timeout: float = 60) -> float:
        start = time.monotonic()
        wait_for(lambda: all(server.nodes().get(n, {}).get("state") == "ready" for n in nodes), timeout,
                 f"{', '.join(nodes)} ready on {server.name}", interval=0.2, detail=self.cluster.logs)
        return time.monotonic() - start
