"""nodeside's write and csr never follow a path another local user could redirect.

Before, ``write`` called ``os.chown`` on the state directory and the key by
path, and ``chown`` follows symbolic links: a user on the node who could write
to a parent of those paths could swap one for a link and have onboarding
(root) give any file or directory to the agent's user.  Real files in a tmp
dir; the test runs as root, and "another user" is uid 65534 (nobody).
"""

from __future__ import annotations

import os
import pwd

import pytest

from llmgw.ctl import nodeside

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="giving files away takes root")

OTHER = 65534
AGENT = "nobody"


def victim(tmp_path, name="victim"):
    """Something only root owns, which no step of onboarding may give away or write."""
    path = tmp_path / name
    path.mkdir()
    (path / "secret").write_text("root's\n")
    return path


def untouched(path) -> bool:
    return path.stat().st_uid == 0 and all(p.stat().st_uid == 0 for p in path.rglob("*"))


def request(root, **paths) -> dict:
    etc, state = paths.get("etc", root / "etc"), paths.get("state", root / "state")
    return {"files": [[str(etc / "agent.yaml"), "node_id: edge1\n", False]], "dirs": [str(state)],
            "owned": [str(etc / "node.key"), str(etc / "agent.yaml")], "owner": AGENT}


def test_a_state_dir_another_user_turned_into_a_link_is_refused_and_nothing_is_given_away(tmp_path):
    target = victim(tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    os.chown(home, OTHER, OTHER)
    (home / "state").symlink_to(target)
    os.lchown(home / "state", OTHER, OTHER)
    with pytest.raises(nodeside.Declined, match=f"{home} belongs to uid {OTHER} .*another user could point "
                                                "onboarding elsewhere"):
        nodeside.write(request(tmp_path, state=home / "state"))
    assert untouched(target)


def test_a_key_another_user_replaced_with_a_link_is_not_given_away(tmp_path):
    target = victim(tmp_path)
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "node.key").symlink_to(target / "secret")
    os.chown(etc, OTHER, OTHER)
    with pytest.raises(nodeside.Declined, match=f"{etc} belongs to uid {OTHER}"):
        nodeside.write(request(tmp_path))
    with pytest.raises(nodeside.Declined, match=f"{etc} belongs to uid {OTHER}"):
        nodeside.csr({"config_dir": str(etc), "node_id": "edge1"})
    assert untouched(target) and not (etc / "agent.yaml").exists()


def test_a_link_owned_by_another_user_anywhere_on_the_way_is_refused(tmp_path):
    target = victim(tmp_path)
    (tmp_path / "opt").symlink_to(target)
    os.lchown(tmp_path / "opt", OTHER, OTHER)
    with pytest.raises(nodeside.Declined, match=f"{tmp_path / 'opt'} belongs to uid {OTHER} .*chown -h root"):
        nodeside.write(request(tmp_path, etc=tmp_path / "opt" / "etc", state=tmp_path / "opt" / "state"))
    assert untouched(target) and not (target / "etc").exists()


def test_a_directory_others_may_write_to_is_refused_unless_sticky(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(nodeside.Declined, match=f"{shared} is writable by others than its owner .*chmod go-w"):
        nodeside.write(request(shared))
    assert not list(shared.iterdir())
    shared.chmod(0o1777)  # as /tmp: another user's entry is neither renamed nor removed by another
    nodeside.csr({"config_dir": str(shared / "etc"), "node_id": "edge1"})
    assert nodeside.write(request(shared))["changed"] == [str(shared / "etc" / "agent.yaml"), str(shared / "state")]


def test_a_key_that_is_a_link_is_refused_even_where_root_made_it(tmp_path):
    target = victim(tmp_path)
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "node.key").symlink_to(target / "secret")
    with pytest.raises(nodeside.Declined, match=f"{etc / 'node.key'} cannot be given to the agent's user .*it is a "
                                                "symbolic link"):
        nodeside.write(request(tmp_path))
    assert untouched(target)


def test_state_and_configuration_dirs_that_root_linked_elsewhere_work_through_their_links(tmp_path):
    agent = pwd.getpwnam(AGENT)
    (tmp_path / "srv" / "state").mkdir(parents=True)
    (tmp_path / "srv" / "etc").mkdir()
    (tmp_path / "state").symlink_to(tmp_path / "srv" / "state")
    (tmp_path / "etc").symlink_to("srv/etc")
    nodeside.csr({"config_dir": str(tmp_path / "etc"), "node_id": "edge1"})
    answer = nodeside.write(request(tmp_path))
    assert answer["changed"] == [str(tmp_path / "etc" / "agent.yaml")]
    real = tmp_path / "srv"
    assert (real / "state").stat().st_uid == agent.pw_uid and (tmp_path / "state").is_symlink()
    assert os.lstat(tmp_path / "state").st_uid == 0
    assert {p.name: p.stat().st_uid for p in (real / "etc").iterdir()} == {
        "agent.yaml": agent.pw_uid, "node.key": agent.pw_uid}
    assert (real / "etc" / "node.key").stat().st_mode & 0o777 == 0o600
    # Run again: nothing to write, and the state dir, now the agent's, is still taken.
    assert nodeside.write(request(tmp_path))["changed"] == []


def test_a_state_path_that_is_a_file_is_refused_in_words(tmp_path):
    (tmp_path / "state").write_text("")
    with pytest.raises(nodeside.Declined, match="state is there and is not a directory; move it away"):
        nodeside.write(request(tmp_path))


def test_check_refuses_a_prefix_another_user_could_swap_before_its_python_is_run_as_root(tmp_path, monkeypatch):
    import socket

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text("#!/bin/sh\n")
    (bin_dir / "systemctl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    home = tmp_path / "home"
    (home / "opt" / "bin").mkdir(parents=True)
    os.chown(home, OTHER, OTHER)
    ran = tmp_path / "ran-as-root"
    (home / "opt" / "bin" / "python").write_text(f"#!/bin/sh\ntouch {ran}\n")
    (home / "opt" / "bin" / "python").chmod(0o755)
    hub = socket.create_server(("127.0.0.1", 0))
    try:
        with pytest.raises(nodeside.Declined, match=f"{home} belongs to uid {OTHER} .* \\(--prefix\\)"):
            nodeside.check({"prefix": str(home / "opt"), "config_dir": str(tmp_path / "etc"),
                            "state_dir": str(tmp_path / "state"), "unit_dir": str(tmp_path / "units"),
                            "owner": AGENT, "hub_host": "127.0.0.1", "hub_port": hub.getsockname()[1],
                            "min_free_mb": 0})
    finally:
        hub.close()
    assert not ran.exists()


def test_remove_removes_nothing_through_a_directory_another_user_could_swap(tmp_path):
    target = victim(tmp_path)
    (target / "node.key").write_text("root's key\n")
    home = tmp_path / "home"
    home.mkdir()
    (home / "etc").symlink_to(target)  # what another user would do with a directory of theirs
    os.chown(home, OTHER, OTHER)
    with pytest.raises(nodeside.Declined, match=f"{home} belongs to uid {OTHER}"):
        nodeside.remove({"prefix": str(tmp_path / "opt"), "config_dir": str(home / "etc"),
                         "state_dir": str(tmp_path / "state"), "unit_dir": str(tmp_path / "units"), "owner": AGENT})
    assert (target / "node.key").exists() and untouched(target)


def test_remove_takes_a_venv_root_linked_elsewhere_and_its_link(tmp_path):
    # Before, shutil.rmtree refused the link with a Python traceback for the operator.
    venv = tmp_path / "srv" / "llmgw"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (venv / "bin" / "twistd").write_text("#!/bin/sh\n")
    (tmp_path / "opt").symlink_to(venv)
    request = {"prefix": str(tmp_path / "opt"), "config_dir": str(tmp_path / "etc"), "state_dir": str(tmp_path / "state"),
               "unit_dir": str(tmp_path / "units"), "owner": AGENT}
    assert nodeside.remove(request)["changed"] == [str(tmp_path / "opt")]
    assert not venv.exists() and not os.path.lexists(tmp_path / "opt") and (tmp_path / "srv").is_dir()



def test_a_shard_record_the_agents_user_made_a_fifo_does_not_hold_offboarding(tmp_path):
    # Before, offboarding (root) opened each record as a file: a FIFO there held it until the step's 20 minutes.
    import subprocess
    import sys

    from tests.support.cluster import environment

    shards = tmp_path / "state" / "shards"
    shards.mkdir(parents=True)
    os.mkfifo(shards / "a.json")
    code = f"from llmgw.ctl import nodehost; print(nodehost.stop_engines({str(tmp_path / 'state')!r}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment(), timeout=60)
    assert out.returncode == 0 and out.stdout == "[]\n", out.stdout + out.stderr
