"""The directories agent.yaml names exist once the agent runs, or the node says why not.

``ctl onboard --weights-dir /srv/weights`` wrote the directory into
agent.yaml and nothing made it: discovery skipped it as it skips an
unmounted filer, and the node showed no disk without a word.  Now the agent
makes its state_dir and weights_dirs at start (mode 0750, its own user),
and what it cannot make or use is a line in its log and a warning the node
registers with, which ``ctl nodes`` prints under the table.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from llmgw.agent import directories
from llmgw.agent.discovery import discover
from tests.support.cluster import Process, cluster, environment, twistd  # noqa: F401 - cluster: a fixture
from tests.support.wait import wait_for


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_what_is_missing_is_made_with_its_parents_0750_and_the_agents_own(tmp_path: Path) -> None:
    old = os.umask(0o077)  # a umask tighter than the promise: the promise is kept, not the umask's
    try:
        assert directories.make(tmp_path / "srv" / "models" / "weights", "weights dir") is None
    finally:
        os.umask(old)
    for made in (tmp_path / "srv", tmp_path / "srv" / "models", tmp_path / "srv" / "models" / "weights"):
        assert mode(made) == 0o750 and made.stat().st_uid == os.geteuid()
    # What existed keeps its own mode.
    (tmp_path / "open").mkdir(mode=0o755)
    os.chmod(tmp_path / "open", 0o755)
    assert directories.make(tmp_path / "open", "weights dir") is None and mode(tmp_path / "open") == 0o755


def test_a_directory_that_cannot_be_made_is_said_and_skipped_by_nothing_else(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    said = directories.make(blocker / "weights", "weights dir")
    assert said == (f"weights dir {blocker / 'weights'} does not exist and the agent cannot make it: "
                    f"{blocker} is not a directory; name another in agent.yaml")
    # Discovery, changing nothing, says the same of it, and of a weights dir that is a file.
    assert directories.weights_dir_problems([str(blocker / "weights")]) == [said]
    assert directories.weights_dir_problems([str(blocker)]) == [
        f"weights dir {blocker} is not a directory: name a directory in agent.yaml, or move what is there"]


def test_discovery_registers_the_reason_a_weights_dir_shows_no_disk(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    weights, blocked = tmp_path / "weights", tmp_path / "a-file" / "weights"
    weights.mkdir()
    inventory = discover(node_id="node01", hub_host="127.0.0.1", hub_port=1, weights_dirs=[str(weights), str(blocked)],
                         labels={}, fabrics={}, sysfs_root=str(tmp_path / "sys"), proc_root=str(tmp_path / "proc"))
    assert [fs.weights_dirs for fs in inventory.filesystems] == [[str(weights)]]
    assert [w for w in inventory.warnings if "weights dir" in w] == [
        f"weights dir {blocked} does not exist and the agent cannot make it: {tmp_path / 'a-file'} is not a "
        "directory; name another in agent.yaml"]
    # Nothing to say when all is well.
    inventory = discover(node_id="node01", hub_host="127.0.0.1", hub_port=1, weights_dirs=[str(weights)],
                         labels={}, fabrics={}, sysfs_root=str(tmp_path / "sys"), proc_root=str(tmp_path / "proc"))
    assert inventory.warnings == []


def test_a_path_for_the_unit_is_written_as_systemd_reads_it() -> None:
    assert directories._unit_path("/srv/weights") == "/srv/weights"
    assert directories._unit_path("/srv/50%/my weights") == '"/srv/50%%/my weights"'


# -- where systemd's ProtectSystem= puts the agent: a read-only mount over all but ReadWritePaths= --

READ_ONLY = """
import json, sys
from llmgw.agent import directories
target, existing = sys.argv[1], sys.argv[2]
print(json.dumps([directories.make(target, "weights dir"), directories.make(existing, "weights dir"),
                  directories.weights_dir_problems([target, existing]),
                  directories.weights_dir_problems([existing, target])]))
"""


def _in_read_only_namespace(read_only: Path, script: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    """*script* in a mount namespace where *read_only* is a read-only bind mount, as systemd's ProtectSystem= makes."""
    shell = f'mount --bind -o ro "$1" "$1" && shift && exec "$@"'
    return subprocess.run(
        ["unshare", "--mount", "--map-root-user", "sh", "-c", shell, "sh", str(read_only),
         sys.executable, "-c", script, *args],
        capture_output=True, text=True, timeout=60, env=environment(**env))


def _namespaces_here(tmp_path: Path) -> bool:
    if shutil.which("unshare") is None:
        return False
    (tmp_path / "probe").mkdir()
    return _in_read_only_namespace(tmp_path / "probe", "pass").returncode == 0


def test_under_systemd_a_read_only_directory_names_the_units_readwritepaths(tmp_path: Path) -> None:
    if not _namespaces_here(tmp_path):
        pytest.skip("no unshare --mount --map-root-user here (user namespaces are off): "
                    "the read-only mount ProtectSystem= makes cannot be made")
    import json

    srv = tmp_path / "srv"
    (srv / "existing").mkdir(parents=True)
    target, existing = srv / "weights", srv / "existing"
    done = _in_read_only_namespace(srv, READ_ONLY, str(target), str(existing), INVOCATION_ID="0123abcd")
    assert done.returncode == 0, done.stderr
    made, used, described, second = json.loads(done.stdout)
    user = directories.user()
    assert made == (f"weights dir {target} does not exist and the agent cannot make it: its systemd unit may write "
                    f"only where ReadWritePaths= says; make the directory (install -d -o {user} -m 0750 {target}), "
                    f"add it there (`systemctl edit llmgw-agent`: [Service] ReadWritePaths={target}) unless the unit "
                    "names it already, and restart the agent (docs/operations.rst 'What the units allow')")
    assert used == (f"weights dir {existing} cannot be written: its systemd unit may write only where "
                    f"ReadWritePaths= says; add it there (`systemctl edit llmgw-agent`: [Service] "
                    f"ReadWritePaths={existing}) unless the unit names it already, and restart the agent "
                    "(docs/operations.rst 'What the units allow')")
    # Discovery says the same, without making anything; a read-only directory the agent only reads is fine:
    # only the first weights dir is fetched into.
    assert described == [made]
    assert second == [used, made]
    assert not target.exists()
    # Outside systemd, a read-only filesystem is only that.
    done = _in_read_only_namespace(srv, READ_ONLY, str(target), str(existing), INVOCATION_ID="")
    assert json.loads(done.stdout)[0] == (f"weights dir {target} does not exist and the agent cannot make it: the "
                                          "filesystem is read-only; name a directory on a writable one in agent.yaml")


# -- a real agent, registering with a real server --

@pytest.mark.integration
def test_a_started_agent_makes_its_directories_and_its_node_says_which_it_could_not(cluster) -> None:
    cluster.start_server()
    config = cluster.agent_config("node01")
    home = config.parent
    (home / "a-file").write_text("")
    state, weights, blocked = home / "var" / "state", home / "srv" / "weights", home / "a-file" / "more"
    text = config.read_text()
    text = text.replace(f"weights_dirs: [{home / 'weights'}]", f"weights_dirs: [{weights}, {blocked}]")
    text = text.replace(f"state_dir: {home / 'state'}", f"state_dir: {state}")
    config.write_text(text)
    agent = Process("node01", twistd("llmgw-agent", config), home / "agent.log", environment()).start()
    cluster.agents["node01"] = agent
    cluster.processes.append(agent)

    node = cluster.wait_node("node01", "ready")
    for made in (state, weights, home / "srv"):
        assert mode(made) == 0o750 and made.stat().st_uid == os.geteuid(), made
    assert [fs["weights_dirs"] for fs in node["filesystems"]] == [[str(weights)]]
    said = (f"weights dir {blocked} does not exist and the agent cannot make it: {home / 'a-file'} is not a "
            "directory; name another in agent.yaml")
    assert said in node["warnings"]
    table = cluster.ctl("nodes")
    assert f"node01: {said}" in table.stdout, table.stdout
    wait_for(lambda: agent.output().count(said) >= 2, 10, "the agent to log it at start and at registering",
             detail=agent.output)
