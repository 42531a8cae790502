"""The package ships every module: a package missing from setup.cfg is missing from `pip install .`."""

from __future__ import annotations

import configparser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_under_src_is_listed_in_setup_cfg():
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    listed = {line.strip() for line in config["options"]["packages"].splitlines() if line.strip()}
    found = {
        ".".join(init.parent.relative_to(ROOT / "src").parts)
        for init in (ROOT / "src").rglob("__init__.py")
    }
    assert found - listed == set(), "add these to [options] packages in setup.cfg"
    assert "twisted.plugins" in listed
