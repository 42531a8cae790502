"""Fixtures for the configuration tests: a directory with TLS files to point at."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def confdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory holding ca.crt, server.crt and server.key.

    Empty files will do: loading checks that the TLS files exist, not what is
    in them.  Tests load configs by relative name from here, so error messages
    read ``server.yaml:3: ...`` exactly as an operator would see them.
    """
    for name in ("ca.crt", "server.crt", "server.key"):
        (tmp_path / name).write_text("")
    monkeypatch.chdir(tmp_path)
    return tmp_path
