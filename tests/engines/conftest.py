from __future__ import annotations

import os
import stat

import pytest


@pytest.fixture
def script(tmp_path):
    """Write an executable shell script: ``script(name, body) -> path``."""

    def write(name: str, body: str, directory=None) -> str:
        path = (directory or tmp_path) / name
        path.write_text("#!/bin/sh\n" + body)
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        return os.fspath(path)

    return write
