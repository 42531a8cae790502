"""Which packages may import which: the control plane and the router meet only where a process is composed."""

from __future__ import annotations

import ast
import runpy
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "llmgw"


def imported(package: str) -> dict[str, set[str]]:
    """Every llmgw module each file of *package* imports, at any depth (lazy imports count)."""
    found = {}
    for path in sorted((SRC / package).rglob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
        found[str(path.relative_to(SRC))] = {n for n in names if n.startswith("llmgw.")}
    return found


@pytest.mark.parametrize("package, forbidden", [
    ("control", "llmgw.router"),
    ("router", "llmgw.control"),
    ("control", "llmgw.process"),
    ("router", "llmgw.process"),
    ("agent", "llmgw.process"),
    ("admin", "llmgw.control"),
    ("admin", "llmgw.router"),
])
def test_a_package_does_not_import_what_is_composed_beside_it(package, forbidden):
    wrong = {
        path: sorted(n for n in names if n == forbidden or n.startswith(forbidden + "."))
        for path, names in imported(package).items()
    }
    assert {path: names for path, names in wrong.items() if names} == {}, (
        f"{package}/ imports {forbidden}: compose the two in llmgw/process/ instead"
    )


def test_the_twistd_plugins_name_the_process_modules():
    plugins = runpy.run_path(str(SRC.parents[1] / "twisted" / "plugins" / "llmgw_plugins.py"))
    makers = [plugins[name] for name in ("llmgw_server", "llmgw_agent", "llmgw_router")]
    assert {m.tapname: m.module for m in makers} == {
        "llmgw-server": "llmgw.process.server",
        "llmgw-agent": "llmgw.process.agent",
        "llmgw-router": "llmgw.process.router",
    }
    for maker in makers:
        options = maker.options()
        options.parseOptions([])
        assert options["config"] == f"/etc/llmgw/{maker.tapname.removeprefix('llmgw-')}.yaml"
