"""The page's script, style and icon ship in the package: without them the page has no style and no follow mode."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.cluster import ROOT

STATIC = ROOT / "src" / "llmgw" / "admin" / "static"


def test_every_static_file_of_the_page_is_in_the_wheel(tmp_path: Path):
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in ("setup.cfg", "pyproject.toml", "README.rst", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy(ROOT / name, tree / name)
    for directory in ("src", "twisted"):
        if (ROOT / directory).exists():
            shutil.copytree(ROOT / directory, tree / directory, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    # build_py is the step that puts a package's files (and its package data) into a wheel.
    out = subprocess.run([sys.executable, "-c", "from setuptools import setup; setup()", "-q", "build_py",
                          "--build-lib", str(tmp_path / "lib")], cwd=tree, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    shipped = {str(p.relative_to(tmp_path / "lib")) for p in (tmp_path / "lib").rglob("*") if p.is_file()}
    wanted = {f"llmgw/admin/static/{p.name}" for p in STATIC.iterdir()}
    assert {"llmgw/admin/static/admin.js", "llmgw/admin/static/admin.css"} <= wanted
    assert "llmgw/admin/site.py" in shipped
    assert wanted - shipped == set(), "add them to [options.package_data] in setup.cfg"
