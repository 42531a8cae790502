"""The wheelhouse onboarding installs from: llmgw's own wheel, pins, tags, and each file held to its sha256 before it leaves."""

from __future__ import annotations

import base64
import csv
import hashlib
import shutil
import sys
import zipfile
from pathlib import Path

import pytest

from llmgw.ctl import nodeinstall, selfwheel, wheelhouse
from llmgw.ctl.ssh import Refusal

X86 = {"python_version": "3.11", "implementation": "cpython", "soabi": "cpython-311-x86_64-linux-gnu",
       "platform": "linux-x86_64", "libc": "glibc 2.28", "installed_set": None}


def flip(path: Path, at: int = -40) -> None:
    """One byte of *path* changed: what a tampered or corrupted wheel looks like."""
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def fake_wheel(directory: Path, name: str, version: str, tag: str = "py3-none-any", body: bytes = b"") -> Path:
    path = directory / f"{name}-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}/__init__.py", body or f"# {name} {version}\n".encode())
    return path


def test_the_nodes_tags_name_every_manylinux_its_glibc_runs_and_nothing_newer():
    tags = wheelhouse.node_tags(X86, "edge1")
    assert (tags.python_version, tags.implementation, tags.abi, tags.machine, tags.glibc) == \
        ("3.11", "cp", "cp311", "x86_64", "2.28")
    platforms = tags.platforms
    assert platforms[0] == "manylinux_2_28_x86_64" and "manylinux_2_29_x86_64" not in platforms
    assert {"manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "manylinux_2_5_x86_64"} <= set(platforms)
    assert platforms[-1] == "linux_x86_64"
    argv = tags.pip_args()
    assert argv[:7] == ["--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311"]
    free = wheelhouse.node_tags({**X86, "python_version": "3.13", "soabi": "cpython-313t-aarch64-linux-gnu",
                                 "platform": "linux-aarch64", "libc": "glibc 2.39"}, "arm1")
    assert (free.abi, free.machine, free.label) == ("cp313t", "aarch64", "cp313t-manylinux_2_39_aarch64")


@pytest.mark.parametrize("found, said", [
    ({"libc": ""}, "edge1 runs an unknown C library on linux-x86_64; onboarding assembles wheelhouses for Linux "
                   "with glibc (manylinux) only"),
    ({"platform": "macosx-14.0-arm64", "libc": ""}, "edge1 runs an unknown C library on macosx-14.0-arm64"),
    ({"implementation": "pypy", "soabi": "pypy310-pp73-x86_64-linux-gnu"},
     "edge1's Python is pypy (pypy310-pp73-x86_64-linux-gnu); onboarding assembles wheelhouses for CPython only"),
])
def test_a_node_no_wheelhouse_is_assembled_for_is_refused_saying_what_to_give(found, said):
    with pytest.raises(Refusal) as refused:
        wheelhouse.node_tags({**X86, **found}, "edge1")
    assert said in str(refused.value) and "--wheels DIR" in str(refused.value)


def test_this_machines_facts_are_what_check_answers_of_it():
    facts = nodeinstall.facts("/nonexistent")
    assert facts["python_version"] == "%d.%d" % sys.version_info[:2] and facts["installed_set"] is None
    here = wheelhouse.this_machine()
    assert here.abi == f"cp{sys.version_info[0]}{sys.version_info[1]}" and here.glibc.startswith("2.")


@pytest.mark.parametrize("version, platform, abi, said", [
    ("3", "manylinux_2_28_x86_64", None, "--python-version '3': give MAJOR.MINOR"),
    ("3.11", "linux_x86_64", None, "--platform 'linux_x86_64': give the node's manylinux tag"),
    ("3.11", "manylinux2014_x86_64", None, "manylinux_2_GLIBC_MACHINE"),
    ("3.11", "manylinux_2_28_x86_64", "abi3", "--abi 'abi3': give a CPython ABI tag"),
])
def test_the_wheelhouse_commands_tags_are_refused_in_words(version, platform, abi, said):
    with pytest.raises(Refusal, match=said):
        wheelhouse.platform_tags(version, platform, abi)
    assert wheelhouse.platform_tags("3.12", "manylinux_2_17_aarch64").label == "cp312-manylinux_2_17_aarch64"


def test_a_plain_wheel_directory_is_pinned_by_the_sha256_computed_before_it_is_sent(tmp_path):
    own = fake_wheel(tmp_path, "llmgw", "0.1.0")
    dep = fake_wheel(tmp_path, "Zope.Interface", "8.7", "cp311-cp311-manylinux_2_17_x86_64")
    (tmp_path / "notes.txt").write_text("not a wheel")
    house = wheelhouse.read(tmp_path, "0.1.0")
    assert sorted(w.name for w in house.wheels) == sorted([own.name, dep.name])
    digest = hashlib.sha256(dep.read_bytes()).hexdigest()
    assert f"zope-interface==8.7 --hash=sha256:{digest}\n" in house.requirements
    assert house.requirements == wheelhouse.read(tmp_path, "0.1.0").requirements  # the same files, the same text
    with pytest.raises(Refusal, match=r"has no llmgw-0\.2\.0-\*\.whl, the server's version; make a wheelhouse with `llmgw ctl wheelhouse NEWDIR`"):
        wheelhouse.read(tmp_path, "0.2.0")
    fake_wheel(tmp_path, "zope_interface", "8.8", "py3-none-any")
    with pytest.raises(Refusal, match="has wheels of more than one version of zope-interface and no requirements.txt"):
        wheelhouse.read(tmp_path, "0.1.0")


def test_a_wheel_changed_after_the_wheelhouse_was_made_is_named_and_nothing_is_sent(tmp_path):
    fake_wheel(tmp_path, "llmgw", "0.1.0")
    dep = fake_wheel(tmp_path, "idna", "3.21")
    wheels = [wheelhouse._hashed(p) for p in sorted(tmp_path.glob("*.whl"))]
    (tmp_path / "requirements.txt").write_text(wheelhouse.requirements_text(wheels))
    assert len(wheelhouse.read(tmp_path, "0.1.0").wheels) == 2
    flip(dep)
    with pytest.raises(Refusal) as refused:
        wheelhouse.read(tmp_path, "0.1.0")
    said = str(refused.value)
    assert said.startswith(f"{dep} has sha256 {hashlib.sha256(dep.read_bytes()).hexdigest()}, which "
                           f"{tmp_path / 'requirements.txt'} does not give idna==3.21: it changed after the "
                           "wheelhouse was made, so nothing was sent"), said
    assert "\n" not in said


def test_a_pinned_wheel_missing_or_an_unpinned_line_is_refused_naming_it(tmp_path):
    own = wheelhouse._hashed(fake_wheel(tmp_path, "llmgw", "0.1.0"))
    listed = tmp_path / "requirements.txt"
    listed.write_text(f"llmgw==0.1.0 \\\n    --hash=sha256:{own.sha256}\nidna==3.21 --hash=sha256:{'0' * 64}\n")
    with pytest.raises(Refusal, match=r"pins idna==3\.21, and .* has no wheel of it"):
        wheelhouse.read(tmp_path, "0.1.0")
    for line in ("--index-url https://pypi.example/simple", "idna>=3", "idna==3.21", "-e .", "git+https://x/y"):
        listed.write_text(f"# pinned\nllmgw==0.1.0 --hash=sha256:{own.sha256}\n\n{line}\n")
        with pytest.raises(Refusal, match=r"requirements\.txt line 4: onboarding takes only NAME==VERSION lines"):
            wheelhouse.read(tmp_path, "0.1.0")
    listed.write_text(f"idna==3.21 --hash=sha256:{'0' * 64}\n")
    with pytest.raises(Refusal, match=r"does not pin llmgw==0\.1\.0, the server's version"):
        wheelhouse.read(tmp_path, "0.1.0")


def test_a_wheel_of_the_pinned_version_only_is_carried_and_the_file_is_sent_as_written(tmp_path):
    own = wheelhouse._hashed(fake_wheel(tmp_path, "llmgw", "0.1.0"))
    dep = wheelhouse._hashed(fake_wheel(tmp_path, "idna", "3.21"))
    fake_wheel(tmp_path, "idna", "3.20")  # not pinned: not carried
    text = (f"llmgw==0.1.0 --hash=sha256:{own.sha256}  # ours\n"
            f"idna==3.21 ; python_version >= '3.8' \\\n  --hash=sha256:{dep.sha256} --hash=sha256:{'a' * 64}\n")
    (tmp_path / "requirements.txt").write_text(text)
    house = wheelhouse.read(tmp_path, "0.1.0")
    assert sorted(w.name for w in house.wheels) == sorted([own.name, dep.name])
    assert house.requirements == text


def test_pins_are_the_versions_this_process_runs():
    import importlib.metadata

    pinned = wheelhouse.pins()
    assert f"attrs=={importlib.metadata.version('attrs')}\n" in pinned
    assert f"twisted=={importlib.metadata.version('twisted')}\n" in pinned
    assert "llmgw==" not in pinned


def test_the_running_llmgw_here_is_the_source_tree_and_its_digest_follows_its_files(tmp_path):
    import llmgw

    here = selfwheel.running()
    root = Path(llmgw.__file__).resolve().parents[2]
    assert (here.kind, here.path, here.version) == ("source", root, llmgw.__version__)
    # A copy of the tree with one byte changed is another llmgw.
    copy = tmp_path / "tree"
    shutil.copytree(root / "src" / "llmgw", copy / "src" / "llmgw", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(root / "setup.cfg", copy / "setup.cfg")
    before = selfwheel.running(str(copy / "src" / "llmgw" / "__init__.py"))
    assert before.kind == "source" and before.path == copy
    digest = before.digest()
    with open(copy / "src" / "llmgw" / "errors.py", "a") as f:
        f.write("\n")
    assert selfwheel.running(str(copy / "src" / "llmgw" / "__init__.py")).digest() != digest


def installed_copy(tmp_path: Path) -> Path:
    """A site-packages holding a pip-installed llmgw: its files and a RECORD pip would write."""
    site = tmp_path / "site-packages"
    package = Path(selfwheel.__file__).resolve().parents[1]
    shutil.copytree(package, site / "llmgw", ignore=shutil.ignore_patterns("__pycache__"))
    info = site / "llmgw-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: llmgw\nVersion: 0.1.0\nRequires-Dist: attrs>=23.1\n")
    (info / "WHEEL").write_text("Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    (info / "INSTALLER").write_text("pip\n")
    rows = []
    for path in sorted(p for p in site.rglob("*") if p.is_file()):
        data = path.read_bytes()
        rows.append([str(path.relative_to(site)),
                     "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode(), len(data)])
    rows += [["../../../bin/llmgw", "sha256=x", "1"], ["llmgw/__pycache__/cli.cpython-311.pyc", "", ""],
             ["llmgw-0.1.0.dist-info/RECORD", "", ""]]
    with open(info / "RECORD", "w", newline="") as f:
        csv.writer(f).writerows(rows)
    return site


def test_an_installed_llmgw_is_zipped_again_from_its_record_the_same_bytes_each_time(tmp_path):
    site = installed_copy(tmp_path)
    found = selfwheel.running(str(site / "llmgw" / "__init__.py"))
    assert (found.kind, found.path, found.version) == ("installed", site / "llmgw-0.1.0.dist-info", "0.1.0")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    one, two = selfwheel.build(found, tmp_path / "a"), selfwheel.build(found, tmp_path / "b")
    assert one.name == "llmgw-0.1.0-py3-none-any.whl" and one.read_bytes() == two.read_bytes()
    with zipfile.ZipFile(one) as z:
        names = set(z.namelist())
        assert z.read("llmgw/ctl/wheelhouse.py") == (site / "llmgw" / "ctl" / "wheelhouse.py").read_bytes()
        record = z.read("llmgw-0.1.0.dist-info/RECORD").decode()
    assert "llmgw-0.1.0.dist-info/METADATA" in names and "llmgw-0.1.0.dist-info/INSTALLER" not in names
    assert not any(n.startswith("..") or n.endswith(".pyc") for n in names)
    assert "llmgw/ctl/wheelhouse.py,sha256=" in record


def test_an_installed_file_changed_since_pip_wrote_it_is_no_llmgw_to_send(tmp_path):
    site = installed_copy(tmp_path)
    with open(site / "llmgw" / "ctl" / "nodeinstall.py", "a") as f:
        f.write("# edited\n")
    with pytest.raises(Refusal) as refused:
        selfwheel.build(selfwheel.running(str(site / "llmgw" / "__init__.py")), tmp_path)
    assert str(refused.value).startswith(f"{site / 'llmgw' / 'ctl' / 'nodeinstall.py'} is not the file pip installed")
    assert "reinstall llmgw here" in str(refused.value)


def test_an_llmgw_neither_installed_nor_in_a_source_tree_is_refused(tmp_path):
    (tmp_path / "llmgw").mkdir()
    with pytest.raises(Refusal, match="is neither an installed distribution nor a source tree"):
        selfwheel.running(str(tmp_path / "llmgw" / "__init__.py"))


def test_a_ctl_of_another_version_than_the_servers_is_refused_before_any_node_unless_given_wheels():
    import llmgw

    wheelhouse.same_version(llmgw.__version__)
    with pytest.raises(Refusal) as refused:
        wheelhouse.same_version("9.9.9")
    assert str(refused.value).startswith(f"this ctl runs llmgw {llmgw.__version__} and the server 9.9.9; onboarding "
                                         "installs on the node the llmgw that runs here")
    assert "--wheels DIR" in str(refused.value)


def test_with_an_index_the_node_is_sent_the_hashes_and_no_wheel(tmp_path):
    fake_wheel(tmp_path, "llmgw", "0.1.0")
    house = wheelhouse.read(tmp_path, "0.1.0")
    request, payload = wheelhouse.install_request(house, "https://wheels.example/simple")
    assert request == {"requirements": house.requirements, "index_url": "https://wheels.example/simple", "wheels": []}
    assert payload == []
    request, payload = wheelhouse.install_request(house, None)
    assert request["wheels"] == [house.wheels[0].sent()] and payload == [house.wheels[0].path]


@pytest.mark.parametrize("url", ["pypi.org/simple", "-oProxyCommand=x", "https://a b/", "https://x/\n", "ftp://x/", ""])
def test_an_index_url_pip_could_read_as_more_or_as_no_url_is_refused(url):
    with pytest.raises(Refusal, match="--index-url .*: give the URL of a package index serving this wheelhouse"):
        wheelhouse.index_url(url)
    assert wheelhouse.index_url("file:///srv/wheels/simple") == "file:///srv/wheels/simple"


def wheel_requiring(directory: Path, name: str, version: str, *requires: str) -> Path:
    path = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}-{version}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                   + "".join(f"Requires-Dist: {r}\n" for r in requires) + "\nRequires-Dist: not-a-header\n")
    return path


def test_a_dependency_only_the_nodes_python_or_machine_needs_is_named_missing(tmp_path):
    from llmgw.ctl import closure

    made = [wheel_requiring(tmp_path, "llmgw", "0.1.0", "twisted[tls]>=24", "old-backport; python_version < '3.12'",
                            "arm-helper; platform_machine == 'aarch64'", "winonly; sys_platform == 'win32'"),
            wheel_requiring(tmp_path, "twisted", "26.1", "pyopenssl>=24; extra == 'tls'", "zope.interface>=5",
                            "tests-only; extra == 'test'"),
            wheel_requiring(tmp_path, "zope_interface", "8.7"),
            wheel_requiring(tmp_path, "pyOpenSSL", "23.0")]
    held = {wheelhouse.project(p.name.split("-")[0]): (p.name.split("-")[1], p) for p in made}
    # This machine's pip fetched for 3.13 on x86_64: a 3.11 node on aarch64 needs two more, and a newer pyOpenSSL.
    assert closure.missing(held, "llmgw", closure.marker_environment("3.11", "aarch64")) == \
        ["arm-helper", "old-backport", "pyopenssl>=24"]
    assert closure.missing(held, "llmgw", closure.marker_environment("3.13", "x86_64")) == ["pyopenssl>=24"]
    held["pyopenssl"] = ("24.1", held["pyopenssl"][1])
    assert closure.missing(held, "llmgw", closure.marker_environment("3.13", "x86_64")) == []


def test_a_cache_others_may_write_to_is_refused_before_anything_is_read_from_it(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    root = wheelhouse.cache_root()
    root.mkdir(parents=True)
    root.chmod(0o777)
    with pytest.raises(Refusal, match=f"the wheelhouse cache {root} belongs to uid .* or others may write to it"):
        wheelhouse.assembled(wheelhouse.platform_tags("3.11", "manylinux_2_28_x86_64"))
    assert list(root.iterdir()) == []


def test_a_wheelhouse_is_renamed_into_place_whole_and_one_made_meanwhile_is_kept(tmp_path):
    where = tmp_path / "house"

    def fill(stage: Path) -> None:
        (stage / "requirements.txt").write_text("mine\n")

    def raced(stage: Path) -> None:
        where.mkdir()
        (where / "requirements.txt").write_text("theirs\n")
        fill(stage)

    wheelhouse._made_whole(where, raced)
    assert (where / "requirements.txt").read_text() == "theirs\n"
    assert [p.name for p in tmp_path.iterdir()] == ["house"]  # no stage left
    (where / "requirements.txt").unlink()  # half made, by a run that was killed
    (where / "some.whl").write_text("")
    wheelhouse._made_whole(where, fill)
    assert sorted(p.name for p in where.iterdir()) == ["requirements.txt"]

    def broken(stage: Path) -> None:
        (stage / "x.whl").write_text("")
        raise Refusal("pip download failed")

    with pytest.raises(Refusal):
        wheelhouse._made_whole(tmp_path / "other", broken)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["house"]


def test_the_wheelhouse_command_asks_nothing_of_this_machine_when_given_the_nodes_tags(tmp_path, monkeypatch):
    import argparse

    def not_linux():
        raise Refusal("this machine runs an unknown C library on macosx-14.0-arm64")

    made = []
    monkeypatch.setattr(wheelhouse, "this_machine", not_linux)
    monkeypatch.setattr(wheelhouse, "_made_whole", lambda where, fill: made.append(where))
    monkeypatch.setattr(wheelhouse, "read", lambda where, version: wheelhouse.Wheelhouse(where, (), "", version))
    with pytest.raises(Refusal, match="macosx"):
        wheelhouse.cmd_wheelhouse(argparse.Namespace(directory=str(tmp_path / "a"), python_version="3.11",
                                                     platform=None, abi=None))
    args = argparse.Namespace(directory=str(tmp_path / "b"), python_version="3.12", platform="manylinux_2_28_aarch64",
                              abi=None)
    assert wheelhouse.cmd_wheelhouse(args) == 0 and made == [tmp_path / "b"]
