"""tests/support/nodeclient.py: the Node client tests skip saying what is missing, and fail under CI=true."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.support import nodeclient


def without(monkeypatch, *tools: str) -> None:
    which = shutil.which
    monkeypatch.setattr(nodeclient.shutil, "which", lambda name: None if name in tools else which(name))


def test_without_node_the_test_skips_saying_what_to_install(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    without(monkeypatch, "node")
    with pytest.raises(pytest.skip.Exception, match="no node on PATH; apt-get install nodejs npm"):
        nodeclient.node_client()


def test_under_ci_without_the_package_or_npm_the_test_fails(monkeypatch, tmp_path):
    monkeypatch.setenv("CI", "true")
    monkeypatch.setattr(nodeclient, "TARGET", tmp_path / "node-openai")
    without(monkeypatch, "npm")
    with pytest.raises(pytest.fail.Exception, match=r"CI=true and the Node client tests cannot run: openai@[\d.]+ is "
                                                    r"not in .*node-openai and there is no npm"):
        nodeclient.node_client()
    assert nodeclient.main() == 1


def test_an_installed_client_of_the_pinned_version_is_used_as_it_is(tmp_path, monkeypatch):
    package = tmp_path / "node_modules" / "openai"
    package.mkdir(parents=True)
    (package / "package.json").write_text(json.dumps({"version": nodeclient.pinned()}))
    without(monkeypatch, "npm")  # nothing is installed: no npm is needed, nor the network
    assert nodeclient.install(tmp_path) == package
    (package / "package.json").write_text(json.dumps({"version": "0.0.1"}))
    with pytest.raises(nodeclient.Missing, match="there is no npm to install it"):
        nodeclient.install(tmp_path)
