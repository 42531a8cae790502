"""Each class name means one thing in src/: a grep for ``class NAME`` finds the one you meant."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# Clashes that other branches of issue 9 (Seams) take apart in parallel with this one.
# The lead empties this after merging them; a new clash is never added here.
# name -> the modules that may share it until then.
# Names allowed to clash while a rename is under way elsewhere; empty once it lands.
NOT_YET_RENAMED: dict[str, set[str]] = {}


def _top_level(body: list[ast.stmt]):
    """The module's own statements, through the ``if``/``try`` blocks a module puts definitions in."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from _top_level(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            yield from _top_level(node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body])


def class_modules(src: Path) -> dict[str, set[str]]:
    """Every top-level class name under *src*, with the dotted modules that define it."""
    found: dict[str, set[str]] = defaultdict(set)
    for path in sorted(src.rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for node in _top_level(ast.parse(path.read_text(encoding="utf-8"), str(path)).body):
            if isinstance(node, ast.ClassDef):
                found[node.name].add(module)
    return found


def clashes(src: Path, allowed: dict[str, set[str]]) -> list[str]:
    """A line per class name defined in two or more modules, less those *allowed* to share it."""
    return [
        f"class {name} is defined in {' and '.join(sorted(modules))}: rename the one that means something else"
        for name, modules in sorted(class_modules(src).items())
        if len(modules) > 1 and not modules <= allowed.get(name, set())
    ]


def test_no_two_modules_in_src_define_a_class_of_the_same_name():
    assert clashes(SRC, NOT_YET_RENAMED) == []


def test_every_name_waiting_for_a_rename_still_clashes():
    modules = class_modules(SRC)
    stale = [
        f"{name} is now defined only in {', '.join(sorted(modules.get(name, ()))) or 'no module'}: "
        "remove it from NOT_YET_RENAMED"
        for name in NOT_YET_RENAMED
        if len(modules.get(name, ())) < 2
    ]
    assert stale == []


def test_a_clash_names_both_modules(tmp_path: Path):
    package = tmp_path / "pkg"
    (package / "inner").mkdir(parents=True)
    (package / "__init__.py").write_text("class Request:\n    pass\n")
    (package / "inner" / "__init__.py").write_text("")
    (package / "inner" / "parse.py").write_text(
        "import sys\nif sys.version_info >= (3,):\n    class Request:\n        pass\n"
    )
    (package / "inner" / "other.py").write_text("def f():\n    class Request:\n        pass\n")

    assert clashes(tmp_path, {}) == [
        "class Request is defined in pkg and pkg.inner.parse: rename the one that means something else"
    ]
    assert clashes(tmp_path, {"Request": {"pkg", "pkg.inner.parse"}}) == []
    assert clashes(tmp_path, {"Request": {"pkg"}}) != []
