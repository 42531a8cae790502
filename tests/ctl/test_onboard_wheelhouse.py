"""`llmgw ctl onboard` installs exactly the operator's llmgw, through a real sshd, into a node whose index has none."""

from __future__ import annotations

import hashlib
import re
import subprocess

import pytest

from llmgw.ctl.wheelhouse import read
from tests.ctl.test_nodeinstall import evil_index, index_of
from tests.ctl.test_onboard import left_nothing, onboard
from tests.ctl.test_wheelhouse import flip

pytestmark = [pytest.mark.sshd, pytest.mark.slow]


@pytest.fixture
def cache(tmp_path_factory, monkeypatch):
    """The operator's wheelhouse cache ($XDG_CACHE_HOME), one for this module's tests."""
    where = tmp_path_factory.getbasetemp() / "operator-cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(where))
    return where / "llmgw" / "wheelhouse"


def test_by_default_a_node_whose_index_has_no_llmgw_gets_the_operators_own_every_file_hashed(fleet, nodes, cache, tmp_path):
    # The node's pip: an empty index, no index at all, and find-links offering another "llmgw 0.1.0".
    node = nodes.add("edge1", env={"PIP_INDEX_URL": "file:///empty", "PIP_NO_INDEX": "1",
                                   "PIP_FIND_LINKS": str(evil_index(tmp_path / "evil"))})
    out = onboard(fleet, nodes, node)
    assert out.returncode == 0, out.stdout + out.stderr + fleet.logs()
    assert re.search(r"^edge1: check: Python \S+ \(3\.\d+, linux-\w+, glibc 2\.\d+\), llmgw not installed \(",
                     out.stdout, re.M), out.stdout
    said = re.search(r"^edge1: install: llmgw (\S+) into \S+ from (\d+) wheels assembled here, carried over, each "
                     r"sha256 checked \(", out.stdout, re.M)
    assert said is not None, out.stdout
    assert fleet.nodes()["edge1"]["state"] == "ready"
    # The wheelhouse is kept for the next node of these tags: llmgw, its pinned dependencies, their hashes.
    (house,) = cache.glob(f"llmgw-{said.group(1)}-cp3*-manylinux_2_*")
    listed = (house / "requirements.txt").read_text()
    assert len(list(house.glob("*.whl"))) == int(said.group(2))
    own = next(house.glob("llmgw-*.whl"))
    assert f"llmgw=={said.group(1)} --hash=sha256:{hashlib.sha256(own.read_bytes()).hexdigest()}" in listed
    # The node runs that llmgw, not the one its own pip settings offered, and says so at check.
    python = node.base / "root" / "opt" / "bin" / "python"
    ran = subprocess.run([str(python), "-c", "import llmgw; print(hasattr(llmgw, 'EVIL'))"], capture_output=True,
                         text=True, timeout=60)
    assert ran.stdout.strip() == "False", ran.stderr
    assert (node.base / "root" / "opt" / "llmgw-requirements.txt").read_text() == listed


def test_a_kept_wheelhouse_with_a_changed_wheel_is_refused_naming_it_and_nothing_reaches_the_node(fleet, nodes, tmp_path):
    node = nodes.add("edge1")
    kept = tmp_path / "wheelhouse"
    made = fleet.ctl("wheelhouse", str(kept), timeout=900)
    assert made.returncode == 0, made.stdout + made.stderr
    assert re.fullmatch(rf"{kept}: llmgw \S+ and \d+ dependencies for cp3\d+-manylinux_2_\d+_\w+, each pinned with "
                        rf"its sha256 in {kept}/requirements.txt; onboard with --wheels {kept}\n", made.stdout), made.stdout
    victim = next(kept.glob("idna-*.whl"))
    flip(victim)
    out = onboard(fleet, nodes, node, wheels=kept)
    assert out.returncode == 1, out.stdout + out.stderr
    sentence = out.stderr.strip().splitlines()[-1]
    assert f"{victim} has sha256 " in sentence and "it changed after the wheelhouse was made, so nothing was sent" \
        in sentence, out.stderr
    left_nothing(node)
    assert not (node.units / "systemctl.calls").exists()


def test_an_index_serving_another_file_than_the_wheelhouses_is_refused_by_the_nodes_pip_naming_it(
        fleet, nodes, wheelhouse, tmp_path):
    node = nodes.add("edge1")
    house = read(wheelhouse, "0.1.0")
    url = index_of(house, tmp_path / "index")
    victim = next(w for w in house.wheels if w.project == "idna")
    flip(tmp_path / "index" / "idna" / victim.name)  # after the wheelhouse's hashes were taken
    out = onboard(fleet, nodes, node, "--index-url", url, wheels=wheelhouse)
    assert out.returncode == 1, out.stdout + out.stderr
    said = re.search(r"^edge1: install failed \(\d+\.\d s\): (.*)$", out.stdout, re.M)
    assert said is not None, out.stdout
    assert said.group(1).startswith(f"pip refused {victim.name}: its sha256 is not the one the wheelhouse's "
                                    "requirements give it, so nothing was installed"), out.stdout
    assert "edge1: left the node as it was" in out.stdout
    left_nothing(node)
