"""axe-core, pinned, from the npm registry into build/axe-core/, run in a page through the DevTools protocol.

``violations(browser)`` injects axe.min.js with ``Runtime.evaluate`` (what
DevTools evaluates is not the page's script, so the page's CSP stays as it
is for everything else) and returns axe's violations as
``"rule: help (n nodes: selector, ...)"``.  Where npm is missing and axe is
not installed, the test skips saying what to install; under CI=true it fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TARGET = ROOT / "build" / "axe-core"
PINNED = "4.10.2"
INSTALL_TIMEOUT_S = 300


def script() -> str:
    """axe.min.js's text, installed first where it is not the pinned version."""
    package = TARGET / "node_modules" / "axe-core"
    try:
        installed = json.loads((package / "package.json").read_text())["version"]
    except (OSError, ValueError, KeyError):
        installed = None
    if installed != PINNED:
        npm = shutil.which("npm")
        why = None
        if npm is None:
            why = f"axe-core {PINNED} is not in {TARGET} and there is no npm to install it; apt-get install npm"
        else:
            TARGET.mkdir(parents=True, exist_ok=True)
            done = subprocess.run([npm, "install", f"axe-core@{PINNED}", "--prefix", str(TARGET), "--no-audit",
                                   "--no-fund", "--ignore-scripts", "--loglevel=error"], capture_output=True, text=True,
                                  timeout=INSTALL_TIMEOUT_S, stdin=subprocess.DEVNULL)
            if done.returncode != 0:
                why = f"npm install axe-core@{PINNED} failed ({done.returncode}): {done.stderr.strip()[-500:]}"
        if why is not None:
            if os.environ.get("CI") == "true":
                pytest.fail(why, pytrace=False)
            pytest.skip(why)
    return (package / "axe.min.js").read_text()


RUN = """axe.run(document, {runOnly: {type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa', 'best-practice']}})
  .then(r => JSON.stringify(r.violations.map(v => v.id + ': ' + v.help + ' (' + v.nodes.length + ' nodes: '
     + v.nodes.slice(0, 3).map(n => n.target.join(' ')).join(', ') + ')')))"""


async def violations(browser) -> list[str]:
    await browser.evaluate(script() + "\n;true")
    return json.loads(await browser.evaluate(RUN))
