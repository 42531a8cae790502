"""The node's install, run here with the real venv and pip: the wheelhouse alone, every file's sha256 checked by pip itself."""

from __future__ import annotations

import hashlib
import io
import subprocess
import zipfile
from pathlib import Path

import pytest

from llmgw.ctl import nodeinstall, wheelhouse

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def house(tmp_path_factory) -> wheelhouse.Wheelhouse:
    """The wheelhouse onboarding assembles by default for a node like this machine, from its index or pip cache."""
    return wheelhouse.assembled(wheelhouse.this_machine(), tmp_path_factory.mktemp("cache"))


def request(prefix: Path, house: wheelhouse.Wheelhouse, wheels: list[dict] | None = None) -> dict:
    return {"prefix": str(prefix), "requirements": house.requirements,
            "wheels": wheels if wheels is not None else [w.sent() for w in house.wheels]}


def carried(house: wheelhouse.Wheelhouse, replace: dict[str, bytes] = {}) -> io.BytesIO:  # noqa: B006
    return io.BytesIO(b"".join(replace.get(w.name) or w.path.read_bytes() for w in house.wheels))


def evil_index(where: Path) -> Path:
    """A find-links directory offering an llmgw 0.1.0 that is not ours, as a public index might one day."""
    where.mkdir()
    with zipfile.ZipFile(where / "llmgw-0.1.0-py3-none-any.whl", "w") as z:
        z.writestr("llmgw/__init__.py", "__version__ = '0.1.0'\nEVIL = True\n")
        z.writestr("llmgw-0.1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: llmgw\nVersion: 0.1.0\n")
        z.writestr("llmgw-0.1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr("llmgw-0.1.0.dist-info/RECORD", "")
    return where


def test_the_node_installs_exactly_the_wheelhouse_whatever_its_own_pip_settings_say(house, tmp_path, monkeypatch):
    assert [w for w in house.wheels if w.project == "llmgw"] and len(house.wheels) > 10
    # The node's pip would look in an empty index, or in one that offers another llmgw 0.1.0.
    monkeypatch.setenv("PIP_INDEX_URL", "file:///empty")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(evil_index(tmp_path / "evil")))
    prefix = tmp_path / "opt" / "llmgw"
    answer = nodeinstall.install(request(prefix, house), stdin=carried(house))
    assert answer == {"changed": [str(prefix)], "created": True}
    python = prefix / "bin" / "python"
    out = subprocess.run([str(python), "-c", "import llmgw; print(llmgw.__version__, hasattr(llmgw, 'EVIL'))"],
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == [house.version, "False"], out.stderr
    # Each dependency at the version this machine runs.
    freeze = subprocess.run([str(python), "-m", "pip", "freeze", "--all"], capture_output=True, text=True, timeout=60,
                            env=nodeinstall.pip_environment()).stdout
    import importlib.metadata

    assert f"\ntwisted=={importlib.metadata.version('twisted')}\n" in freeze.lower()
    # check says, of this venv, the sha256 of the very requirements it came from.
    assert nodeinstall.facts(str(prefix))["installed_set"] == house.requirements_sha256
    assert not list((tmp_path / "opt").glob(".llmgw-wheels-*"))


def test_a_wheel_tampered_before_it_was_hashed_for_the_journey_is_refused_by_pip_naming_it(house, tmp_path):
    # The file changed before the sha256 sent beside it was computed: it arrives "intact", and
    # only the wheelhouse's requirements, which pip checks with --require-hashes, know better.
    victim = next(w for w in house.wheels if w.project == "idna")
    data = bytearray(victim.path.read_bytes())
    data[-40] ^= 0x01

    sent = [{**w.sent(), "sha256": hashlib.sha256(bytes(data)).hexdigest()} if w is victim else w.sent()
            for w in house.wheels]
    prefix = tmp_path / "opt" / "llmgw"
    with pytest.raises(nodeinstall.InstallRefused) as refused:
        nodeinstall.install(request(prefix, house, sent), stdin=carried(house, {victim.name: bytes(data)}))
    said = str(refused.value)
    assert said.startswith(f"pip refused {victim.name}: its sha256 is not the one the wheelhouse's requirements "
                           "give it, so nothing was installed"), said
    assert "\n" not in said
    assert not (tmp_path / "opt").exists() or not list((tmp_path / "opt").iterdir())


def test_a_request_with_neither_wheels_nor_an_index_installs_nothing(tmp_path):
    with pytest.raises(nodeinstall.InstallRefused, match="carries no wheels and names no index"):
        nodeinstall.install({"prefix": str(tmp_path / "opt"), "requirements": "", "wheels": []}, stdin=io.BytesIO())
    assert not (tmp_path / "opt").exists()


def index_of(house: wheelhouse.Wheelhouse, where: Path) -> str:
    """A simple package index (PEP 503, a page per project) on file:// serving the wheelhouse's files."""
    for wheel in house.wheels:
        (where / wheel.project).mkdir(parents=True, exist_ok=True)
        (where / wheel.project / wheel.name).write_bytes(wheel.path.read_bytes())
        (where / wheel.project / "index.html").write_text(f'<a href="{wheel.name}">{wheel.name}</a>\n')
    return where.as_uri() + "/"


def test_from_an_index_the_operator_names_the_same_hashes_hold(house, tmp_path):
    url = index_of(house, tmp_path / "index")
    prefix = tmp_path / "opt" / "llmgw"
    request, payload = wheelhouse.install_request(house, url)
    assert payload == []
    assert nodeinstall.install({"prefix": str(prefix), **request}, stdin=io.BytesIO())["created"]
    assert nodeinstall.facts(str(prefix))["installed_set"] == house.requirements_sha256
    # The index serves a different file under the same name: pip refuses it, and nothing is installed.
    victim = next(w for w in house.wheels if w.project == "attrs")
    served = tmp_path / "index" / "attrs" / victim.name
    data = bytearray(served.read_bytes())
    data[-40] ^= 0x01
    served.write_bytes(bytes(data))
    again = tmp_path / "opt2" / "llmgw"
    with pytest.raises(nodeinstall.InstallRefused, match=f"^pip refused {victim.name}: its sha256 is not the one"):
        nodeinstall.install({"prefix": str(again), **request}, stdin=io.BytesIO())
    assert not (tmp_path / "opt2").exists() or not list((tmp_path / "opt2").iterdir())


def test_the_assembled_wheelhouse_holds_every_dependency_the_nodes_markers_ask_for(house):
    from llmgw.ctl import closure

    held = {w.project: (w.version, w.path) for w in house.wheels}
    tags = wheelhouse.this_machine()
    assert closure.missing(held, "llmgw", closure.marker_environment(tags.python_version, tags.machine)) == []
    assert {"twisted", "pyopenssl", "service-identity", "cryptography", "cffi"} <= set(held)  # twisted[tls]'s too
