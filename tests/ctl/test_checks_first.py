"""Onboarding and offboarding refuse a name that is not a node's before they change anything.

Before, ``ctl offboard NAME`` drained NAME and, without ``--unreachable``,
removed the llmgw install on the host ssh reaches as NAME, and only then
did its revoke step refuse a certificate that was the server's or an
operator's.  ``ctl onboard --name NAME`` installed llmgw and made a key on
the node before its signing step refused the same.  Now both ask the CA
first (``--ca-dir``, or the control plane's, which changes nothing when
asked ``check=True``), and a name the link would refuse (``node_``) is an
error of the command line.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest

from tests.ctl.test_onboard import left_nothing, onboard, where

pytestmark = [pytest.mark.sshd, pytest.mark.slow]


def llmgw_install(node) -> list:
    """What onboarding leaves on *node* in the tests' layout: a venv with llmgw's twistd, and the configuration."""
    root = node.base / "root"
    made = [root / "opt" / "pyvenv.cfg", root / "opt" / "bin" / "twistd", root / "etc" / "agent.yaml",
            root / "etc" / "node.key"]
    for path in made:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("llmgw's\n")
    return made


def test_offboarding_a_name_whose_certificate_is_not_a_nodes_touches_neither_the_fleet_nor_the_host(fleet, nodes, tmp_path):
    agent = fleet.start_agent("node01")
    fleet.wait_node("node01", "ready")
    for name, role in (("llmgw-server", "server"), ("alice", "operator")):
        host = nodes.add(name)
        installed = llmgw_install(host)
        for ca in ([], ["--ca-dir", str(fleet.pki)]):
            out = fleet.ctl("offboard", name, "--ssh-config", str(nodes.operator.config), *where(nodes), *ca,
                            "--json", timeout=120)
            assert out.returncode == 1, out.stdout + out.stderr
            result = json.loads(out.stdout)
            assert [s["step"] for s in result["steps"]] == ["check"], result
            assert f"is the {role} certificate of {name}, not a node's" in result["reason"], result
            assert "nothing was drained, removed or revoked" in result["reason"], result
            assert all(p.exists() for p in installed), (ca, [p for p in installed if not p.exists()])
    # A node the CA holds no certificate of: refused before it is drained.
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(fleet.pki, elsewhere)
    (elsewhere / "node01.crt").unlink()
    out = fleet.ctl("offboard", "node01", "--unreachable", "--ca-dir", str(elsewhere), "--json", timeout=120)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "has no certificate node01.crt to revoke" in json.loads(out.stdout)["reason"]
    view = fleet.nodes()["node01"]
    assert view["state"] == "ready" and not view["cordoned"], view
    assert not (fleet.pki / "crl.pem").exists() and not (elsewhere / "crl.pem").exists()
    assert agent.running()


def test_onboarding_a_name_whose_certificate_is_not_a_nodes_is_refused_before_the_node_is_changed(fleet, nodes):
    host = nodes.add("llmgw-server")
    for ca in ([], ["--ca-dir", str(fleet.pki)]):
        out = onboard(fleet, nodes, host, *ca)
        assert out.returncode == 1, out.stdout + out.stderr
        assert re.search(r"^llmgw-server: name failed", out.stdout, re.M), out.stdout
        assert not re.search(r"^llmgw-server: (install|key)", out.stdout, re.M), out.stdout
        assert "is the server certificate of llmgw-server, not a node's" in out.stdout, out.stdout
        assert "left the node as it was" in out.stdout, out.stdout
        left_nothing(host)


def test_a_label_the_agent_would_refuse_is_refused_before_any_node_is_reached(fleet, nodes):
    # Before, onboarding wrote it into agent.yaml, started the unit, and the agent refused to start.
    host = nodes.add("edge1")
    out = onboard(fleet, nodes, host, "--label", "rack= r1")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "the agent would refuse the agent.yaml onboarding writes for edge1 (labels.rack: ' r1'" in out.stderr, out.stderr
    assert "change --label" in out.stderr and "edge1: check" not in out.stdout, out.stdout + out.stderr
    left_nothing(host)
