"""``--weights-dir``: made on the node for the agent's user, and writable under the agent's hardened unit.

Before, a weights dir was written into agent.yaml and nothing more: it was not
made on the node, and under the unit's ``ProtectSystem=strict`` (only the
state dir, ``%S/llmgw-weights`` and /tmp writable) one elsewhere was
read-only, so the node showed no disk and never said why.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
from pathlib import Path

import pytest

from llmgw.ctl import nodehost, nodeside
from llmgw.ctl.layout import Layout, unit_text
from llmgw.ctl.ssh import Refusal
from tests.ctl.test_hostile_values import BAD_PATHS
from tests.ctl.test_nodeside_links import AGENT, OTHER, untouched, victim

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving directories away takes root")


def test_the_unit_makes_each_weights_dir_writable_beside_its_own():
    layout = Layout(weights_dirs=("/data/weights", "/srv/{node}/w")).for_node("gpu05")
    lines = unit_text(None, layout).splitlines()
    shipped = unit_text(None, Layout()).splitlines()
    own = lines.index(next(line for line in shipped if line.startswith("ReadWritePaths=")))
    assert lines[own + 2] == "ReadWritePaths=/data/weights /srv/gpu05/w", lines[own:own + 3]
    assert [line for line in lines if not line.startswith("#")] == \
        [line for line in shipped[:own + 1] + [lines[own + 2]] + shipped[own + 1:] if not line.startswith("#")]
    # No --weights-dir, no line: the shipped unit as it was.
    assert unit_text(None, Layout()) == unit_text(None, Layout(weights_dirs=()))


def test_an_operators_unit_gets_the_line_in_its_service_section_or_is_refused(tmp_path):
    own = tmp_path / "mine.service"
    own.write_text("[Unit]\nDescription=x\n\n[Service]\nExecStart=/opt/llmgw/bin/twistd\n\n[Install]\nWantedBy=x\n")
    filled = unit_text(str(own), Layout(weights_dirs=("/data/w",)))
    assert "[Service]\n# --weights-dir, written by `llmgw ctl onboard`\nReadWritePaths=/data/w\nExecStart=" in filled
    own.write_text("[Unit]\nDescription=x\n")
    with pytest.raises(Refusal, match=f"the agent's unit {own} has no \\[Service\\] section"):
        unit_text(str(own), Layout(weights_dirs=("/data/w",)))


@pytest.mark.parametrize("value", BAD_PATHS)
def test_a_weights_dir_the_unit_would_read_as_more_than_a_path_is_refused(value):
    with pytest.raises(Refusal, match="^--weights-dir "):
        unit_text(None, Layout(weights_dirs=("/data/w", value)))


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not on this machine")
def test_systemd_reads_the_weights_dirs_as_the_paths_they_are(tmp_path):
    prefix = tmp_path / "opt"
    (prefix / "bin").mkdir(parents=True)
    shutil.copy("/bin/true", prefix / "bin" / "twistd")
    weights = [tmp_path / "data" / "a+b@c,d-e_f.g", tmp_path / "w2"]
    unit = tmp_path / "llmgw-agent.service"
    layout = Layout(str(prefix), str(tmp_path / "etc"), str(tmp_path / "state"), user="root",
                    weights_dirs=tuple(map(str, weights)))
    unit.write_text(unit_text(None, layout))
    out = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stderr.strip() == "", out.stderr
    # The check can fail: a path systemd would not take as one is refused by systemd's own parser.
    unit.write_text(unit.read_text().replace(f"ReadWritePaths={weights[0]}", "ReadWritePaths=data/relative"))
    out = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert "data/relative" in out.stderr, out.stderr


@as_root
def test_write_makes_each_weights_dir_the_agents_0750_and_gives_one_there_to_it(tmp_path):
    made, there = tmp_path / "data" / "weights", tmp_path / "old"
    there.mkdir(mode=0o755)
    answer = nodeside.write({"files": [], "dirs": [], "owned": [], "owner": AGENT,
                             "weights_dirs": [str(made), str(there)]})
    assert answer["changed"] == [str(made)]
    for path, mode in ((made, 0o750), (there, 0o755)):  # a dir already there keeps its mode
        st = path.stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (OTHER, mode), (path, st)
    assert (tmp_path / "data").stat().st_uid == 0  # only the weights dir itself is the agent's


@as_root
def test_a_weights_dir_another_user_could_redirect_is_refused_and_nothing_is_given_away(tmp_path):
    target = victim(tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    os.chown(home, OTHER, OTHER)
    (home / "weights").symlink_to(target)
    with pytest.raises(nodeside.Declined, match=f"{home} belongs to uid {OTHER} .*another user could point"):
        nodeside.write({"files": [], "dirs": [], "owned": [], "owner": AGENT, "weights_dirs": [str(home / "weights")]})
    assert untouched(target)


@as_root
def test_check_refuses_a_weights_dir_another_user_could_redirect_before_anything_is_changed(tmp_path, monkeypatch):
    booted = tmp_path / "booted"
    booted.mkdir()
    monkeypatch.setenv(nodehost.SYSTEMD_DIR_ENV, str(booted))
    home = tmp_path / "home"
    home.mkdir()
    os.chown(home, OTHER, OTHER)
    hub = socket.create_server(("127.0.0.1", 0))
    try:
        with pytest.raises(nodeside.Declined) as declined:
            nodeside.check({"prefix": str(tmp_path / "opt"), "config_dir": str(tmp_path / "etc"),
                            "state_dir": str(tmp_path / "state"), "unit_dir": str(tmp_path / "units"),
                            "owner": AGENT, "hub_host": "127.0.0.1", "hub_port": hub.getsockname()[1],
                            "min_free_mb": 0, "min_state_free_mb": 0, "weights_dirs": [str(home / "w")]})
    finally:
        hub.close()
    said = str(declined.value)
    assert f"{home} belongs to uid {OTHER} " in said and "choose another path (--weights-dir)" in said, said
    assert sorted(os.listdir(tmp_path)) == ["booted", "home"] and os.listdir(home) == []


@pytest.mark.parametrize("fields,said", [
    ({"weights_dirs": ("/",)}, "--weights-dir '/' is, or holds, the system's /bin"),
    ({"weights_dirs": ("/etc/systemd",)}, "--weights-dir '/etc/systemd' is, or holds, the system's /etc/systemd/system"),
    ({"weights_dirs": ("/usr/local/bin/",)}, "--weights-dir '/usr/local/bin/' is, or holds, the system's /usr/local/bin"),
    ({"weights_dirs": ("/var/lib",)}, "--weights-dir '/var/lib' is, or holds, the system's /var/lib"),
    ({"weights_dirs": ("/etc",)}, "--weights-dir '/etc' is, or holds, the system's /etc/systemd/system"),
    ({"weights_dirs": ("/opt/llmgw/bin",)}, "--weights-dir '/opt/llmgw/bin' is inside --prefix '/opt/llmgw'"),
    ({"weights_dirs": ("/etc/llmgw",)}, "--weights-dir '/etc/llmgw' holds --config-dir '/etc/llmgw'"),
    ({"weights_dirs": ("/srv/{node}",), "prefix": "/srv/{node}/opt"}, "--weights-dir '/srv/{node}' holds --prefix"),
    ({"weights_dirs": ("/data/w",), "unit_dir": "/data/w/units"}, "--weights-dir '/data/w' holds --unit-dir"),
    ({"state_dir": "/var/lib"}, "--state-dir '/var/lib' is, or holds, the system's /var/lib"),
    ({"state_dir": "/data", "prefix": "/data/opt"}, "--state-dir '/data' holds --prefix '/data/opt'"),
])
def test_a_directory_the_agent_would_own_is_never_the_systems_the_venvs_or_the_configurations(fields, said):
    # Onboarding gives these to the agent's user and makes them writable under its unit: /etc/systemd/system
    # given away is root for that user; /opt/llmgw/bin is what onboarding runs as root next.
    with pytest.raises(Refusal) as refusal:
        unit_text(None, Layout(**fields))
    assert str(refusal.value).startswith(said), str(refusal.value)


def test_the_directories_the_agent_owns_may_sit_beside_and_below_the_others():
    Layout(weights_dirs=("/data", "/var/lib/llmgw/w", "/data/{node}/w", "/mnt/nvme0/weights")).checked()
    Layout("/srv/{node}/opt", "/srv/{node}/etc", "/srv/{node}/state", weights_dirs=("/srv/{node}/w",)).checked()


@pytest.fixture
def open_tmp():
    """A directory anyone may pass (pytest's own tmp dirs are root's, 0700)."""
    import tempfile

    made = Path(tempfile.mkdtemp(prefix="llmgw-reach-", dir="/tmp"))
    made.chmod(0o755)
    yield made
    shutil.rmtree(made)


@as_root
def test_check_refuses_a_place_the_agents_user_cannot_reach_before_anything_is_changed(open_tmp, monkeypatch):
    # Before, a weights dir under a root-only directory was made and given to the agent, which could not reach it.
    booted = open_tmp / "booted"
    booted.mkdir()
    monkeypatch.setenv(nodehost.SYSTEMD_DIR_ENV, str(booted))
    closed, etc = open_tmp / "closed", open_tmp / "etc"
    closed.mkdir(mode=0o700)
    etc.mkdir(mode=0o700)  # the agent reads agent.yaml there
    request = {"prefix": str(open_tmp / "opt"), "config_dir": str(etc), "state_dir": str(closed / "state"),
               "unit_dir": str(open_tmp / "units"), "owner": AGENT, "min_free_mb": 0, "min_state_free_mb": 0,
               "weights_dirs": [str(closed / "weights"), str(open_tmp / "open" / "weights")]}
    hub = socket.create_server(("127.0.0.1", 0))
    try:
        with pytest.raises(nodeside.Declined) as declined:
            nodeside.check({**request, "hub_host": "127.0.0.1", "hub_port": hub.getsockname()[1]})
    finally:
        hub.close()
    said = str(declined.value)
    assert f"the agent's user {AGENT} cannot pass {closed} (mode 0700, uid 0, gid 0) to reach {closed / 'state'} " \
           f"(--state-dir), {closed / 'weights'} (--weights-dir); let it (chmod o+x {closed})" in said, said
    assert f"cannot pass {etc} (mode 0700, uid 0, gid 0) to reach {etc} (--config-dir)" in said, said
    assert str(open_tmp / "open") not in said and "--prefix" not in said, said
    assert sorted(os.listdir(open_tmp)) == ["booted", "closed", "etc"] and os.listdir(closed) == []
