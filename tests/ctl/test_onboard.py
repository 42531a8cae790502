"""`llmgw ctl onboard` and `offboard` against real sshd instances on 127.0.0.1, a real server, the real agent."""

from __future__ import annotations

import json
import re
import shutil

import openai
import pytest

from llmgw.ctl.ssh import Refusal, Ssh
from tests.support.cluster import Process, environment, twistd
from tests.support.net import free_port
from tests.support.procs import alive
from tests.support.wait import wait_for

pytestmark = [pytest.mark.sshd, pytest.mark.slow]


def where(nodes) -> list[str]:
    """Layout flags that keep each node's install in its own directory (``{node}`` is its id, and its alias)."""
    root = str(nodes.base / "{node}")
    return ["--prefix", f"{root}/root/opt", "--config-dir", f"{root}/root/etc", "--unit-dir", f"{root}/units"]


def onboard(fleet, nodes, hosts, *extra: str, wheels=None):
    hosts = hosts if isinstance(hosts, list) else [hosts]
    argv = ["onboard", *(n.alias for n in hosts), "--ssh-config", str(nodes.operator.config),
            *(f for n in hosts for f in ("--name", n.alias)), *where(nodes),
            "--state-dir", str(nodes.base / "{node}" / "root" / "state"), "--user", "root",
            "--weights-dir", str(nodes.base / "{node}" / "weights"), *extra]
    if wheels is not None:
        argv += ["--wheels", str(wheels)]
    return fleet.ctl(*argv, timeout=900)


def offboard(fleet, nodes, node):
    return fleet.ctl("offboard", node.alias, "--ssh-config", str(nodes.operator.config), *where(nodes), timeout=300)


def left_nothing(node) -> None:
    assert not (node.base / "root").exists(), sorted(p.name for p in (node.base / "root").rglob("*"))
    assert not (node.units / "llmgw-agent.service").exists()


def test_onboard_serves_reruns_as_a_no_op_and_offboard_keeps_it_out(fleet, nodes, wheelhouse):
    node = nodes.add("edge1")
    out = onboard(fleet, nodes, node, "--label", "rack=r1", wheels=wheelhouse)
    assert out.returncode == 0, out.stdout + out.stderr + fleet.logs()
    # Every step is said as it ran, with its duration.
    for step in ("check", "name", "install", "key", "certificate", "configure", "start", "register"):
        assert re.search(rf"^edge1: {step}: .* \(\d+\.\d s\)$", out.stdout, re.M), out.stdout
    assert f"wheels from {wheelhouse}, carried over, each sha256 checked" in out.stdout
    assert re.search(r"^edge1\s+ready\s", out.stdout, re.M), out.stdout
    etc = node.base / "root" / "etc"
    key = (etc / "node.key").read_bytes()
    assert oct((etc / "node.key").stat().st_mode & 0o777) == "0o600"
    assert not list(node.base.rglob("ca.key"))
    # The unit that runs is contrib's, with the layout filled in.
    unit = (node.units / "llmgw-agent.service").read_text()
    assert f"ExecStart={node.base}/root/opt/bin/twistd" in unit and "/opt/llmgw" not in unit
    # The weights dir is made for the agent's user, and writable under the unit's ProtectSystem=strict.
    assert f"\nReadWritePaths={node.base}/weights\n" in unit
    assert oct((node.base / "weights").stat().st_mode & 0o777) == "0o750"
    assert "rack" in (etc / "agent.yaml").read_text()

    # The node serves a replica through the router.
    def ready():
        answer = json.loads(fleet.ctl("replicas", "--json").stdout)
        return [r for r in answer if r["state"] == "ready" and r["nodes"] == ["edge1"]] or None

    wait_for(ready, 60, "echo ready on edge1", interval=0.3, detail=fleet.logs)
    client = openai.OpenAI(base_url=fleet.api + "/v1", api_key="unused", max_retries=0, timeout=30)

    def answered():
        # The router's table follows the control plane's by one push: "is starting" until it has it.
        try:
            return client.chat.completions.create(model="echo", messages=[{"role": "user", "content": "hello"}])
        except openai.InternalServerError as e:
            assert "has no ready replica: its replica is starting" in str(e), e
            return None

    reply = wait_for(answered, 30, "the router to route echo to edge1", interval=0.3, detail=fleet.logs)
    assert reply.choices[0].message.content

    again = onboard(fleet, nodes, node, "--label", "rack=r1", wheels=wheelhouse)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "nothing changed: edge1 already runs llmgw" in again.stdout
    assert "the node's key, kept" in again.stdout and "the node's certificate is current" in again.stdout
    assert (etc / "node.key").read_bytes() == key

    # A file changed on the node is put back, and the agent restarted on it, with the same key.
    with open(etc / "agent.yaml", "a") as f:
        f.write("heartbeat_interval_s: 1000\n")
    repaired = onboard(fleet, nodes, node, "--label", "rack=r1", wheels=wheelhouse)
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert re.search(r"^edge1: configure: wrote \S*/agent.yaml \(", repaired.stdout, re.M), repaired.stdout
    assert "edge1: start: llmgw-agent.service (re)started" in repaired.stdout
    assert "heartbeat_interval_s" not in (etc / "agent.yaml").read_text()
    assert (etc / "node.key").read_bytes() == key

    kept = node.base / "kept"
    kept.mkdir()
    for name in ("node.crt", "node.key", "ca.crt"):
        shutil.copy(etc / name, kept / name)
    pid = node.agent_pid()
    gone = offboard(fleet, nodes, node)
    assert gone.returncode == 0, gone.stdout + gone.stderr
    assert re.search(r"^edge1: drain: cordoned, 1 shard\(s\) stopped \(", gone.stdout, re.M), gone.stdout
    assert re.search(r"^edge1: remove: `systemctl stop llmgw-agent.service` succeeded; removed ", gone.stdout, re.M), gone.stdout
    assert re.search(r"^edge1: revoke: serial [0-9a-f]+ revoked", gone.stdout, re.M), gone.stdout
    wait_for(lambda: not alive(pid), 15, "the agent to stop")
    assert not (node.base / "root" / "opt").exists() and not (etc / "node.key").exists()
    assert not (node.units / "llmgw-agent.service").exists()

    # The same key and certificate can no longer join.
    (kept / "agent.yaml").write_text(
        f'hub: "{fleet.hub}"\ntls: {{ca: ca.crt, cert: node.crt, key: node.key}}\nnode_id: edge1\n'
        f"state_dir: {kept / 'state'}\nweights_dirs: [{kept / 'weights'}]\n")
    agent = Process("revoked", twistd("llmgw-agent", kept / "agent.yaml"), kept / "agent.log", environment()).start()
    fleet.processes.append(agent)
    wait_for(lambda: "revoked on" in fleet.server.output() and "edge1" in fleet.server.output().split("revoked on")[0][-400:],
             30, "the hub to refuse edge1's revoked certificate", detail=fleet.logs)
    # Offboarded, it is forgotten: not listed, not lost.
    assert "edge1" not in fleet.nodes()

    # The machine onboarded again: a new key, the revoked name taken without --replace.
    back = onboard(fleet, nodes, node, wheels=wheelhouse)
    assert back.returncode == 0, back.stdout + back.stderr + fleet.logs()
    assert "edge1: name: not in the fleet yet" in back.stdout and "a new key made on the node" in back.stdout
    assert fleet.nodes()["edge1"]["state"] == "ready"


def test_two_nodes_in_parallel_both_register(fleet, nodes, wheelhouse):
    a, b = nodes.add("pa"), nodes.add("pb")
    out = onboard(fleet, nodes, [a, b], "--parallel", "2", wheels=wheelhouse)
    assert out.returncode == 0, out.stdout + out.stderr + fleet.logs()
    assert re.search(r"^pa\s+onboarded\s+\d+\.\d\s+-$", out.stdout, re.M), out.stdout
    assert re.search(r"^pb\s+onboarded\s+\d+\.\d\s+-$", out.stdout, re.M), out.stdout
    found = fleet.nodes()
    assert found["pa"]["state"] == found["pb"]["state"] == "ready"
    # Both ran at once: each was checked before the other registered.
    assert out.stdout.index("pb: check:") < out.stdout.index("pa: register:")
    assert out.stdout.index("pa: check:") < out.stdout.index("pb: register:")
    assert out.stdout.count("\nNODE  STATE") + out.stdout.startswith("NODE  STATE") == 1, out.stdout


def refused(out, sentence: str) -> None:
    assert out.returncode == 1, out.stdout + out.stderr
    assert sentence in out.stdout, out.stdout + out.stderr
    assert "left the node as it was" in out.stdout, out.stdout


def test_an_unknown_host_key_is_refused_and_nothing_is_done(fleet, nodes):
    node = nodes.add("edge1", known=False)
    out = onboard(fleet, nodes, node)
    refused(out, "edge1's host key is not one known_hosts holds for it")
    assert "never turns host-key checking off" in out.stdout
    left_nothing(node)


def test_an_unreachable_host_is_refused(fleet, nodes, tmp_path):
    node = nodes.add("edge1")
    node.stop()
    out = onboard(fleet, nodes, node)
    refused(out, "cannot reach edge1 over ssh: ")
    left_nothing(node)


def test_no_suitable_python_is_refused(fleet, nodes, tmp_path):
    node = nodes.add("edge1")
    # An old node's Python, as onboarding sees one: the version check fails, --version says 3.9.
    old = tmp_path / "old-python" / "python3"
    old.parent.mkdir()
    old.write_text('#!/bin/sh\nif [ "$1" = --version ]; then echo "Python 3.9.18"; exit 0; fi\n'
                   'if [ "$1" = -c ]; then exit 1; fi\necho "not a real Python" >&2; exit 2\n')
    old.chmod(0o755)
    out = onboard(fleet, nodes, node, "--python", str(old))
    refused(out, "there is no Python 3.11 or newer on ")
    assert "is Python 3.9" in out.stdout
    left_nothing(node)


def test_a_name_the_fleet_has_is_refused_unless_replace(fleet, nodes, wheelhouse):
    fleet.start_agent("node01")
    fleet.wait_node("node01", "ready")
    node = nodes.add("node01")
    out = onboard(fleet, nodes, node)
    refused(out, "the fleet already has a node node01 (ready, at 127.0.0.1)")
    assert "--replace" in out.stdout
    left_nothing(node)
    # With --replace this machine becomes node01, and the old one's certificate is revoked.
    old = fleet.agents["node01"]
    out = onboard(fleet, nodes, node, "--replace", wheels=wheelhouse)
    assert out.returncode == 0, out.stdout + out.stderr + fleet.logs()
    assert "node01: name: replacing node01 (--replace): its old certificate is revoked" in out.stdout
    wait_for(lambda: "revoked on" in fleet.server.output(), 30, "the hub to refuse the old node01", detail=fleet.logs)
    assert old.running()  # the old agent is refused, not killed: it is another machine
    assert fleet.nodes()["node01"]["state"] == "ready"


def test_a_name_that_is_not_one_dns_label_is_refused(fleet, nodes):
    node = nodes.add("edge1.example.org")
    out = onboard(fleet, nodes, node)
    # Refused as the command line is read (the one rule, node_name_problem), before the hub or ssh.
    assert out.returncode == 2, out.stdout + out.stderr
    assert "--name: 'edge1.example.org' is not a single DNS label" in out.stderr, out.stderr
    assert "use 'edge1', its short host name" in out.stderr, out.stderr
    left_nothing(node)


def test_a_hub_the_node_cannot_reach_is_refused(fleet, nodes):
    node = nodes.add("edge1")
    out = onboard(fleet, nodes, node, "--node-hub", f"wss://127.0.0.1:{free_port()}/")
    refused(out, "cannot be reached from this node")
    left_nothing(node)


def test_a_wheel_whose_checksum_does_not_match_installs_nothing(nodes, wheelhouse):
    node = nodes.add("edge1")
    root = node.base / "root"
    wheel = next(wheelhouse.glob("llmgw-*.whl"))
    request = {"prefix": str(root / "opt"), "requirements": "llmgw\n", "wheels": [
        {"name": wheel.name, "size": wheel.stat().st_size, "sha256": "0" * 64}]}
    with pytest.raises(Refusal, match=f"{wheel.name} arrived with sha256 [0-9a-f]{{64}}, not the 0{{64}}"):
        Ssh(node.alias, str(nodes.operator.config)).run("install", request, payload=[wheel])
    assert not root.exists() and not list(node.base.glob(".llmgw-wheels-*"))


def test_a_failed_install_says_the_command_its_status_and_stderr_and_removes_its_venv(fleet, nodes, wheelhouse, tmp_path):
    node = nodes.add("edge1")
    partial = tmp_path / "partial"
    partial.mkdir()
    shutil.copy(next(wheelhouse.glob("llmgw-*.whl")), partial)
    out = onboard(fleet, nodes, node, wheels=partial)
    assert out.returncode == 1, out.stdout + out.stderr
    assert re.search(r"^edge1: install failed \(\d+\.\d s\): `ssh -o BatchMode=yes -o ConnectTimeout=10 -F \S+ -- "
                     r"edge1 '.*'` \(stdin: llmgw's nodeside.py and its install request, then \d+ wheels\) exited "
                     r"with status 1: .*pip install failed \(exit status 1\): .* --require-hashes ", out.stdout, re.M | re.S), out.stdout
    assert "No matching distribution" in out.stdout or "Could not find a version" in out.stdout, out.stdout
    assert "edge1: left the node as it was" in out.stdout
    left_nothing(node)


def test_refusals_made_before_any_ssh(fleet, nodes, tmp_path):
    node = nodes.add("edge1")
    out = fleet.ctl("onboard", "edge1", "--name", "a", "--name", "b", "--ssh-config", str(nodes.operator.config))
    assert out.returncode == 1 and "2 --name for 1 hosts" in out.stderr, out.stdout + out.stderr
    (tmp_path / "empty").mkdir()
    out = onboard(fleet, nodes, node, wheels=tmp_path / "empty")
    assert out.returncode == 1 and "has no llmgw-" in out.stderr and "llmgw ctl wheelhouse NEWDIR" in out.stderr, out.stderr
    left_nothing(node)
    assert not (node.units / "systemctl.calls").exists()


def test_a_server_without_a_ca_says_where_to_sign(cluster, nodes):
    cluster.start_server()
    node = nodes.add("edge1")
    out = onboard(cluster, nodes, node)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "the server keeps no CA (pki.ca_dir in server.yaml is not set)" in out.stderr
    assert "--ca-dir DIR" in out.stderr
    left_nothing(node)


def fake_python(node, body: str) -> str:
    """A "python" on the node that passes the version probe and then does *body* (sh) instead of nodeside."""
    path = node.bin / "python-fake"
    path.write_text(f"#!/bin/sh\ncase \"$2\" in *version_info*) exit 0;; esac\n{body}\n")
    path.chmod(0o755)
    return str(path)


def test_a_node_that_answers_too_much_or_nonsense_is_stopped_and_not_trusted(fleet, nodes):
    node = nodes.add("edge1")
    out = onboard(fleet, nodes, node, "--python", fake_python(node, "head -c 3000000 /dev/zero | tr '\\0' x"))
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"wrote more than {1 << 20} bytes, which is no answer of llmgw's; stopped" in out.stdout, out.stdout[-2000:]
    out = onboard(fleet, nodes, node, "--python", fake_python(
        node, """cat >/dev/null; printf '{"hostname": 7, "python": "x", "installed": null, "certificate": null, "has_key": false}\\n'"""))
    assert out.returncode == 1, out.stdout + out.stderr
    assert "answered hostname=7, which is not what llmgw's nodeside answers" in out.stdout, out.stdout
    out = onboard(fleet, nodes, node, "--json", "--python", fake_python(node, "cat >/dev/null; printf 'ok\\033[2J\\n' >&2; exit 1"))
    [result] = json.loads(out.stdout)
    assert result["result"] == "failed" and result["node"] is None and result["host"] == "edge1"
    assert "exited with status 1: ok\\x1b[2J" in result["reason"] and "\033" not in out.stderr
    left_nothing(node)


def test_offboarding_a_machine_that_is_gone_drains_and_revokes_and_the_hub_closes_it(fleet):
    agent = fleet.start_agent("node01")
    fleet.wait_node("node01", "ready")
    out = fleet.ctl("offboard", "node01", "--unreachable", "--json", timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.loads(out.stdout)
    assert result["result"] == "offboarded" and [s["step"] for s in result["steps"]] == ["check", "drain", "remove", "revoke"]
    assert "node node01's certificate, serial " in result["steps"][0]["said"], result
    assert "skipped (--unreachable)" in result["steps"][2]["said"]
    assert "1 connections closed" in result["steps"][3]["said"], result
    # Forgotten at once: not listed, so never lost (no LlmgwNodeLost); its agent, refused, stays out.
    assert "node01" not in fleet.nodes()
    assert agent.running()
    again = fleet.ctl("offboard", "node01", "--unreachable", timeout=60)
    assert again.returncode == 0 and "was already revoked" in again.stdout, again.stdout + again.stderr


def test_removing_touches_no_prefix_that_is_not_an_llmgw_venv(nodes):
    node = nodes.add("edge1")
    prefix = node.base / "root" / "opt"
    prefix.mkdir(parents=True)
    (prefix / "precious").write_text("not llmgw's")
    request = {"prefix": str(prefix), "config_dir": str(node.base / "root" / "etc"), "state_dir": "/nonexistent",
               "unit_dir": str(node.units), "owner": "root"}
    assert Ssh(node.alias, str(nodes.operator.config)).run("remove", request)["changed"] == []
    assert (prefix / "precious").exists()


def test_a_failed_step_shows_the_ssh_command_it_ran_which_runs_again_as_shown(nodes):
    import shlex
    import subprocess

    from llmgw.ctl.ssh import StepFailed

    node = nodes.add("edge1")
    with pytest.raises(StepFailed) as failed:
        Ssh(node.alias, str(nodes.operator.config)).run("check", {}, python="/nonexistent/python3")
    shown = re.fullmatch(r"`(.*)` \(stdin: llmgw's nodeside.py and its check request\) exited with status 127: .*",
                         str(failed.value), re.S)
    assert shown is not None, str(failed.value)
    argv = shlex.split(shown.group(1))
    assert argv[:4] == ["ssh", "-o", "BatchMode=yes", "-o"] and argv[-2:-1] == ["edge1"]
    assert "/nonexistent/python3" in argv[-1]
    again = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
    assert again.returncode == 127, again.stderr
