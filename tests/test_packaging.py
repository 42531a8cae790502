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


def test_the_wheel_carries_the_agents_unit_and_onboarding_reads_it_from_an_installed_llmgw(tmp_path):
    """`ctl onboard` from a pip-installed llmgw: the unit comes from the package, and it is contrib/'s."""
    import os
    import subprocess
    import sys
    import zipfile

    unit = (ROOT / "contrib" / "llmgw-agent.service").read_text()
    assert (ROOT / "src" / "llmgw" / "ctl" / "llmgw-agent.service").read_text() == unit, \
        "src/llmgw/ctl/llmgw-agent.service differs from contrib/'s: copy contrib/'s over it"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir",
                            str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-4000:]
    (wheel,) = tmp_path.glob("llmgw-*.whl")
    with zipfile.ZipFile(wheel) as z:
        assert z.read("llmgw/ctl/llmgw-agent.service").decode() == unit
    # The venv's llmgw (`make install`, not the source tree): no contrib/ beside it.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = ("import llmgw, sys; from llmgw.ctl.onboard import Layout, unit_text; "
            "print(llmgw.__file__); sys.stdout.write(unit_text(None, Layout('/srv/x', user='svc')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-4000:]
    where, text = out.stdout.split("\n", 1)
    assert not where.startswith(str(ROOT / "src")), f"{where}: run `make install` (not an editable install)"
    assert "/srv/x/bin/" in text and "User=svc" in text
