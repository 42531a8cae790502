"""`make run`: a server and a local agent on 127.0.0.1 with a development CA.

Everything goes under ``./run`` (or ``LLMGW_RUN_DIR``): the CA and
certificates, the three configuration files, the logs.  Run it again and it
reuses them.  Ctrl-C stops both processes.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from llmgw import pki
from llmgw.link.authz import NODE_ID

SERVER_NAME = "llmgw-server"
OPERATOR_NAME = "admin"


def local_node_id() -> str:
    name = socket.gethostname().split(".")[0]
    return name if NODE_ID.match(name) else "local"


def prepare(run: Path, link_port: int) -> dict[str, Path]:
    """Create what is missing under *run*; return the paths of the config files."""
    tls = run / "pki"
    node_id = local_node_id()
    if not (tls / "ca.crt").exists():
        pki.init_ca(tls, name="llmgw-dev")
    wanted = [
        (SERVER_NAME, "server", ("localhost", "127.0.0.1")),
        (node_id, "node", ()),
        (OPERATOR_NAME, "operator", ()),
    ]
    for name, role, sans in wanted:
        if not (tls / f"{name}.crt").exists():
            pki.issue(tls, name, role, sans=sans)
    for sub in ("weights", "state", "logs"):
        (run / sub).mkdir(parents=True, exist_ok=True)

    server_yaml = _write_once(
        run / "server.yaml",
        f"""# Written by `make run`; edit freely, it is written again only if deleted.
listen:
  link: "ssl:{link_port}:interface=127.0.0.1"
  api: "tcp:8080:interface=127.0.0.1"
  admin: "tcp:9090:interface=127.0.0.1"
tls: {{ca: pki/ca.crt, cert: pki/{SERVER_NAME}.crt, key: pki/{SERVER_NAME}.key}}
fleet: {{unreachable_after_s: 15, lost_after_s: 120}}
""",
    )
    agent_yaml = _write_once(
        run / "agent.yaml",
        f"""# Written by `make run`.
hub: "wss://127.0.0.1:{link_port}/"
tls: {{ca: pki/ca.crt, cert: pki/{node_id}.crt, key: pki/{node_id}.key}}
node_id: {node_id}
weights_dirs: [{(run / 'weights').resolve()}]
state_dir: {(run / 'state').resolve()}
""",
    )
    ctl_yaml = _write_once(
        run / "ctl.yaml",
        f"""# Written by `make run`: llmgw ctl --config {run / 'ctl.yaml'} nodes
hub: "wss://127.0.0.1:{link_port}/"
tls: {{ca: pki/ca.crt, cert: pki/{OPERATOR_NAME}.crt, key: pki/{OPERATOR_NAME}.key}}
""",
    )
    return {"server": server_yaml, "agent": agent_yaml, "ctl": ctl_yaml}


def _write_once(path: Path, text: str) -> Path:
    """Write *path* unless it exists: an operator's edits survive the next `make run`."""
    if not path.exists():
        path.write_text(text)
    return path


def twistd(plugin: str, config: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", "from twisted.scripts.twistd import run; run()", "--nodaemon", "--pidfile=", f"--logfile={log}",
         plugin, "--config", str(config)],
        start_new_session=True,
    )


def main() -> int:
    run = Path(os.environ.get("LLMGW_RUN_DIR", "run")).resolve()
    link_port = int(os.environ.get("LLMGW_LINK_PORT", "7443"))
    files = prepare(run, link_port)
    logs = run / "logs"
    server = twistd("llmgw-server", files["server"], logs / "server.log")
    time.sleep(1.0)
    agent = twistd("llmgw-agent", files["agent"], logs / "agent.log")
    ctl = [sys.executable, "-m", "llmgw", "ctl", "--config", str(files["ctl"])]
    print(
        f"""
llmgw is running from {run}
  hub (mutual TLS WebSocket, realm llmgw)  wss://127.0.0.1:{link_port}/
  server log   {logs / 'server.log'}
  agent log    {logs / 'agent.log'}
  the fleet    llmgw ctl --config {files['ctl']} nodes
Ctrl-C stops both.
""",
        flush=True,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            out = subprocess.run(ctl + ["nodes"], capture_output=True, text=True)
            if out.returncode == 0 and "ready" in out.stdout:
                print(out.stdout, flush=True)
                break
            if server.poll() is not None or agent.poll() is not None:
                print("a process exited early; see the logs above", file=sys.stderr)
                return 1
            time.sleep(0.5)
        while server.poll() is None and agent.poll() is None:
            time.sleep(0.5)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        for proc in (agent, server):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in (agent, server):
            proc.wait(timeout=10)


if __name__ == "__main__":
    sys.exit(main())
