"""Which part of llmgw may import which: the control plane and the agent meet only in neutral modules.

The server and the agents are separate processes that speak over the link;
what both must agree on (records, states, cache names, TLS files, the hub
URL) lives in modules neither owns.  These rules are checked by reading every
import in src/llmgw, including those inside functions, so a shortcut across
the line fails here rather than in review.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "llmgw"

# part -> what it must never import.  The router is left out on purpose: it
# still imports control/admin.py until that moves.
FORBIDDEN = {
    "llmgw.control": ("llmgw.agent", "llmgw.tui", "llmgw.ctl"),
    "llmgw.agent": ("llmgw.control", "llmgw.tui", "llmgw.ctl"),
}
# The CA's tools run where the CA lives, with no link; the link reads what
# they write.  What both must agree on (roles, a node's id) is llmgw.roles.
PKI = {"llmgw.pki": ("llmgw.link",)}
# The contracts two processes share import no process's package.
NEUTRAL = ("llmgw.records", "llmgw.wire", "llmgw.states", "llmgw.errors",
           "llmgw.weightnames", "llmgw.tlsfiles", "llmgw.huburl", "llmgw.durable", "llmgw.text",
           "llmgw.wiretext", "llmgw.hostnames", "llmgw.roles", "llmgw.setting")
PARTS = ("llmgw.agent", "llmgw.control", "llmgw.router", "llmgw.link", "llmgw.config",
         "llmgw.ctl", "llmgw.tui", "llmgw.sim", "llmgw.engines", "llmgw.pki")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(module: str, source: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, module) for every import in *source*, relative ones made absolute.

    ``from a import b`` yields both ``a`` and ``a.b``, since b may be a module.
    """
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = module.split(".") if is_package else module.split(".")[:-1]
                anchor = here[: len(here) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def within(name: str, part: str) -> bool:
    return name == part or name.startswith(part + ".")


def all_imports() -> list[tuple[str, str, int, str]]:
    """(module, file, line, imported) for every import in src/llmgw."""
    rows = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        for line, target in imports(module, path.read_text("utf-8"), path.name == "__init__.py"):
            rows.append((module, str(path.relative_to(SRC.parent)), line, target))
    return rows


def crossings(rules: dict[str, tuple[str, ...]], rows) -> list[str]:
    return sorted({
        f"{file}:{line}: {module} imports {target}"
        for module, file, line, target in rows
        for part, banned in rules.items() if within(module, part)
        for other in banned if within(target, other)
    })


@pytest.fixture(scope="module")
def rows():
    return all_imports()


def test_the_control_plane_and_the_agent_import_nothing_of_each_other_nor_of_ctl_or_the_tui(rows):
    assert crossings(FORBIDDEN, rows) == []


def test_the_certificate_authority_imports_nothing_of_the_link(rows):
    assert crossings(PKI, rows) == []


def test_the_shared_contracts_import_no_part_of_a_process(rows):
    assert crossings({m: PARTS for m in NEUTRAL}, rows) == []


def test_the_scan_sees_imports_inside_functions_and_relative_ones(rows):
    seen = {(module, target) for module, _, _, target in rows}
    # plane.py imports control.weights inside a method; agent/weights/fetch.py uses "from .errors".
    assert ("llmgw.control.plane", "llmgw.control.weights") in seen
    assert ("llmgw.agent.weights.fetch", "llmgw.agent.weights.errors") in seen
    assert ("llmgw.pki", "llmgw.pki.subject") in seen


def test_a_crossing_is_reported_with_its_file_and_line():
    source = "import os\n\ndef f():\n    from llmgw.agent import weights\n"
    rows = [("llmgw.control.x", "src/llmgw/control/x.py", line, target)
            for line, target in imports("llmgw.control.x", source)]
    assert crossings(FORBIDDEN, rows) == [
        "src/llmgw/control/x.py:4: llmgw.control.x imports llmgw.agent",
        "src/llmgw/control/x.py:4: llmgw.control.x imports llmgw.agent.weights",
    ]
    assert crossings(FORBIDDEN, [("llmgw.controller", "f.py", 1, "llmgw.agent")]) == []
