"""One rule for a relative path in server.yaml: it is read from the file's directory, whatever the key.

``tls.*`` were read so, but ``pki.ca_dir`` had to be absolute: a server.yaml
that named its CA as ``pki`` beside ``tls: {ca: pki/ca.crt}`` was refused.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from llmgw.config.server import load_server_config


def write(directory: Path, pki: Path, ca_dir: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "ca").symlink_to(pki, target_is_directory=True)
    path = directory / "server.yaml"
    path.write_text('listen: {link: "ssl:7443"}\n'
                    "tls: {ca: ca/ca.crt, cert: ca/llmgw-server.crt, key: ca/llmgw-server.key}\n"
                    f"pki: {{ca_dir: {ca_dir}}}\n")
    return path


@pytest.mark.parametrize("ca_dir", ["ca", "./ca", "ca/", "sub/../ca"])
def test_pki_ca_dir_is_read_from_the_config_files_directory_as_tls_is(tmp_path, pki, monkeypatch, ca_dir):
    path = write(tmp_path / "etc", pki, ca_dir)
    monkeypatch.chdir(tmp_path)  # not the file's directory: the working directory must not matter
    config = load_server_config(path)
    assert config.pki.ca_dir == str(tmp_path / "etc" / "ca")
    assert config.tls.ca == os.path.join(config.pki.ca_dir, "ca.crt")


def test_pki_ca_dir_under_home_and_absolute(tmp_path, pki, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert load_server_config(write(tmp_path / "a", pki, "~/llmgw-ca")).pki.ca_dir == str(tmp_path / "home" / "llmgw-ca")
    assert load_server_config(write(tmp_path / "b", pki, str(pki))).pki.ca_dir == str(pki)
