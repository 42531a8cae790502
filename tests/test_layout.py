"""The layout src/llmgw is held to: who imports whom, one class per name, short modules, findable tests.

The server, the agents and the routers are separate processes; what two of
them must agree on lives in the neutral modules at the top of the package,
which import no process's package.  Every rule here reads the source itself
(every import, those inside functions too; every top-level class; every
line), and every failure names a file and a line.  The allow-lists are of
debts: each may only shrink, and an entry that is no longer needed fails
until it is taken off.
"""

from __future__ import annotations

import ast
import runpy
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = SRC / "llmgw"
TESTS = ROOT / "tests"
HERE = Path(__file__).resolve()

# -- who imports whom --

# part -> (what it must never import, why).  The router is held by COMPOSED below.
FORBIDDEN = {
    "llmgw.control": (("llmgw.agent", "llmgw.tui", "llmgw.ctl"),
                      "the control plane and the agents meet over the link, in the neutral modules"),
    "llmgw.agent": (("llmgw.control", "llmgw.tui", "llmgw.ctl"),
                    "the control plane and the agents meet over the link, in the neutral modules"),
    # The CA's tools run where the CA lives, with no link; the link reads what
    # they write.  What both must agree on (roles, a node's id) is llmgw.roles.
    "llmgw.pki": (("llmgw.link",), "what the CA and the link share belongs in a neutral module (llmgw.roles)"),
    # The transport's limits are its own (link/settings.py); config builds them from server.yaml.
    "llmgw.link": (("llmgw.config",),
                   "the link takes its settings as records (llmgw.link.settings), never reads config"),
    # The election and its etcd client serve the server's parts, which import them; process/ builds them from config.
    "llmgw.ha": (("llmgw.control", "llmgw.router", "llmgw.agent", "llmgw.admin", "llmgw.process", "llmgw.config",
                  "llmgw.ctl", "llmgw.tui"),
                 "the control plane, the router, the agent and the admin page import llmgw.ha, never the other way"),
}
# part -> (what is composed beside it, only in llmgw/process/).
COMPOSED = {
    "llmgw.control": ("llmgw.router", "llmgw.process"),
    "llmgw.router": ("llmgw.control", "llmgw.process"),
    "llmgw.agent": ("llmgw.process",),
    "llmgw.admin": ("llmgw.control", "llmgw.router"),
}
# The top of the package that composes, rather than shares: the command line and `make run`.
COMPOSERS = ("llmgw", "llmgw.__main__", "llmgw.cli", "llmgw.devrun")
# Top-level modules that still import a process's package: module -> what it imports and should not.
NOT_YET_NEUTRAL: dict[str, str] = {}


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
            rows.append((module, str(path.relative_to(ROOT)), line, target))
    return rows


def crossings(rules: dict[str, tuple[tuple[str, ...], str]], rows) -> list[str]:
    """A line per import that crosses one of *rules*: "FILE:LINE: MODULE imports TARGET: WHY"."""
    return sorted({
        f"{file}:{line}: {module} imports {target}: {why}"
        for module, file, line, target in rows
        for part, (banned, why) in rules.items() if within(module, part)
        for other in banned if within(target, other)
    })


def parts() -> tuple[str, ...]:
    """The process packages: each directory of src/llmgw that is a package."""
    return tuple(sorted(f"llmgw.{p.parent.name}" for p in PACKAGE.glob("*/__init__.py")))


def neutral() -> list[str]:
    """The modules at the top of the package, less those that compose."""
    return sorted(module_name(p) for p in PACKAGE.glob("*.py") if module_name(p) not in COMPOSERS)


def neutral_rules() -> dict[str, tuple[tuple[str, ...], str]]:
    why = "a neutral module holds a contract two processes share; it imports no process's package"
    return {m: (tuple(p for p in parts() if p != NOT_YET_NEUTRAL.get(m)), why) for m in neutral()}


@pytest.fixture(scope="module")
def rows():
    return all_imports()


def test_the_control_plane_the_agent_and_the_ca_import_nothing_across_their_lines(rows):
    assert crossings(FORBIDDEN, rows) == []


def test_what_a_process_composes_meets_only_in_llmgw_process(rows):
    why = "compose the two in llmgw/process/ instead"
    assert crossings({part: (banned, why) for part, banned in COMPOSED.items()}, rows) == []


def test_the_neutral_modules_import_no_part_of_a_process(rows):
    assert "llmgw.records" in neutral() and "llmgw.cli" not in neutral()
    assert {"llmgw.agent", "llmgw.control", "llmgw.process", "llmgw.admin"} <= set(parts())
    assert crossings(neutral_rules(), rows) == []


def test_every_module_not_yet_neutral_still_imports_what_it_is_listed_for(rows):
    stale = [
        f"{entry('NOT_YET_NEUTRAL', module)}: {module} no longer imports {part}: take it off NOT_YET_NEUTRAL"
        for module, part in NOT_YET_NEUTRAL.items()
        if not any(m == module and within(target, part) for m, _, _, target in rows)
    ]
    assert stale == []


def test_the_scan_sees_imports_inside_functions_and_relative_ones(rows):
    seen = {(module, target) for module, _, _, target in rows}
    # plane.py imports control.weights inside a method; agent/weights/fetch.py uses "from .errors".
    assert ("llmgw.control.plane", "llmgw.control.weights") in seen
    assert ("llmgw.agent.weights.fetch", "llmgw.agent.weights.errors") in seen
    assert ("llmgw.pki", "llmgw.pki.subject") in seen


def test_a_crossing_is_reported_with_its_file_line_and_why():
    source = "import os\n\ndef f():\n    from llmgw.agent import weights\n"
    rows = [("llmgw.control.x", "src/llmgw/control/x.py", line, target)
            for line, target in imports("llmgw.control.x", source)]
    why = "the control plane and the agents meet over the link, in the neutral modules"
    assert crossings(FORBIDDEN, rows) == [
        f"src/llmgw/control/x.py:4: llmgw.control.x imports llmgw.agent.weights: {why}",
        f"src/llmgw/control/x.py:4: llmgw.control.x imports llmgw.agent: {why}",
    ]
    assert crossings(FORBIDDEN, [("llmgw.controller", "f.py", 1, "llmgw.agent")]) == []


def test_the_twistd_plugins_name_the_process_modules():
    plugins = runpy.run_path(str(ROOT / "twisted" / "plugins" / "llmgw_plugins.py"))
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


# -- one class per name --


def _top_level(body: list[ast.stmt]):
    """The module's own statements, through the ``if``/``try`` blocks a module puts definitions in."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from _top_level(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            yield from _top_level(node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body])


def class_places(src: Path) -> dict[str, list[str]]:
    """Every top-level class name under *src*, with the FILE:LINE of each definition."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(src.rglob("*.py")):
        for node in _top_level(ast.parse(path.read_text(encoding="utf-8"), str(path)).body):
            if isinstance(node, ast.ClassDef):
                found[node.name].append(f"{path.relative_to(src.parents[1])}:{node.lineno}")
    return found


def clashes(src: Path) -> list[str]:
    """A line per class name defined twice or more: a grep for ``class NAME`` must find the one meant."""
    return [
        f"{places[0]}: class {name} is defined again at {', '.join(places[1:])}: rename the one that means "
        "something else"
        for name, places in sorted(class_places(src).items()) if len(places) > 1
    ]


def test_no_two_modules_in_src_define_a_class_of_the_same_name():
    assert clashes(PACKAGE) == []


def test_a_clash_names_both_places(tmp_path: Path):
    package = tmp_path / "src" / "pkg"
    (package / "inner").mkdir(parents=True)
    (package / "__init__.py").write_text("class Request:\n    pass\n")
    (package / "inner" / "__init__.py").write_text("")
    (package / "inner" / "parse.py").write_text(
        "import sys\nif sys.version_info >= (3,):\n    class Request:\n        pass\n"
    )
    (package / "inner" / "other.py").write_text("def f():\n    class Request:\n        pass\n")

    assert clashes(package) == [
        "src/pkg/__init__.py:1: class Request is defined again at src/pkg/inner/parse.py:3: rename the one that means "
        "something else"
    ]


# -- short modules --

CEILING = 500  # a module has fewer lines than this (wc -l): one family of things to a module
# Modules at or over the ceiling, with the lines each had when listed: split them, and take them off.
LONG_MODULES: dict[str, int] = {}


def lines_of(path: Path) -> int:
    return len(path.read_bytes().splitlines())


def entry(allow_list: str, key: str) -> str:
    """FILE:LINE of *key*'s entry in this file's *allow_list*, for a failure to point at."""
    lines = HERE.read_text("utf-8").splitlines()
    start = next(n for n, text in enumerate(lines) if text.startswith(f"{allow_list} = {{"))
    number = next((n for n, text in enumerate(lines[start:], start) if text.lstrip().startswith(f'"{key}"')), start)
    return f"{HERE.relative_to(ROOT)}:{number + 1}"


def too_long(package: Path, listed: dict[str, int]) -> list[str]:
    found = []
    for path in sorted(package.rglob("*.py")):
        name, n = str(path.relative_to(package)), lines_of(path)
        where = f"{path.relative_to(package.parents[1])}:{CEILING}"
        if n >= CEILING and name not in listed:
            found.append(f"{where}: {n} lines, the ceiling is {CEILING - 1}: split it, one family of things a module")
        elif name in listed and n > listed[name]:
            found.append(f"{where}: {n} lines, more than the {listed[name]} LONG_MODULES allows it: split it")
    return found


def test_every_module_is_under_the_ceiling_and_no_long_one_grows():
    assert too_long(PACKAGE, LONG_MODULES) == []


def test_every_long_module_listed_is_still_long():
    stale = []
    for name in LONG_MODULES:
        path = PACKAGE / name
        if not path.exists():
            stale.append(f"{entry('LONG_MODULES', name)}: src/llmgw/{name} is gone: take it off LONG_MODULES")
        elif lines_of(path) < CEILING:
            stale.append(f"{entry('LONG_MODULES', name)}: src/llmgw/{name} is {lines_of(path)} lines now, "
                         f"under {CEILING}: take it off LONG_MODULES")
    assert stale == []


def test_a_long_module_is_named_at_the_ceilings_line(tmp_path: Path):
    package = tmp_path / "src" / "pkg"
    package.mkdir(parents=True)
    (package / "big.py").write_text("x = 1\n" * CEILING)
    (package / "fine.py").write_text("x = 1\n" * (CEILING - 1))
    assert too_long(package, {}) == [
        f"src/pkg/big.py:{CEILING}: {CEILING} lines, the ceiling is {CEILING - 1}: split it, one family of things "
        "a module"
    ]
    assert too_long(package, {"big.py": CEILING}) == []
    assert too_long(package, {"big.py": CEILING - 10}) == [
        f"src/pkg/big.py:{CEILING}: {CEILING} lines, more than the {CEILING - 10} LONG_MODULES allows it: split it"
    ]


# -- findable tests --

# Modules with no tests/<package path>/test_<module>*.py, by package: their tests
# are elsewhere under another name, or are through what uses them.  Give each a
# test file where the rule looks (or move the one that covers it), and take it off.
NO_TEST_FILE = {
    "": "errors hostnames http11 huburl records roles setting states tlsfiles webclient weightnames",
    "admin": "auth site source",
    "agent": "enginelist health logbuffer logtail nodeid ports procs service shard statefiles",
    "agent/discovery": "cpu fakenvml gpus host infiniband memory storage",
    "agent/engines": "downloads layout proving",
    "agent/weights": "body errors pace partial records refusals snapshot",
    "config": "agent catalog common ctl endpoints router routing schema server yamlpos",
    "control": "lograte news placement_scorers relay replicaview sections startup",
    "ctl": "closure layout main nodehost selfwheel ssh",
    "engines": "base releases",
    "link": "authz client local peer settings uris",
    "pki": "commands held nodes revocation subject",
    "process": "agent common router server",
    "router": "bodies errors server service tablesession upstream",
    "sim": "api connection engine metrics options server",
    "tui": "app columns common confirm details fake fleet help logs nodes replicas store table",
}


def where_tests_of(name: str, tests: Path = TESTS) -> tuple[Path, str]:
    """Where the tests of src/llmgw/*name* are looked for: their directory, and the file pattern."""
    path = Path(name)
    return tests / path.parent, f"test_{path.stem}*.py"


def modules(package: Path) -> list[str]:
    return sorted(str(p.relative_to(package)) for p in package.rglob("*.py")
                  if p.name not in ("__init__.py", "__main__.py"))


def listed() -> dict[str, str]:
    """Each module NO_TEST_FILE names, with its package's key."""
    return {(f"{key}/{stem}.py" if key else f"{stem}.py"): key
            for key, stems in NO_TEST_FILE.items() for stem in stems.split()}


def untested(package: Path, tests: Path, excused: set[str]) -> list[str]:
    found = []
    for name in modules(package):
        where, pattern = where_tests_of(name, tests)
        if name not in excused and not list(where.glob(pattern)):
            found.append(f"{package.relative_to(package.parents[1])}/{name}:1: no "
                         f"{where.relative_to(tests.parent)}/{pattern} tests it: write it there")
    return found


def test_every_module_has_a_test_file_where_its_package_says():
    assert untested(PACKAGE, TESTS, set(listed())) == []


def test_every_module_without_a_test_file_is_still_without_one_and_still_there():
    stale = []
    for name, key in listed().items():
        where, pattern = where_tests_of(name)
        if not (PACKAGE / name).exists():
            stale.append(f"{entry('NO_TEST_FILE', key)}: src/llmgw/{name} is gone: take it off NO_TEST_FILE")
        elif list(where.glob(pattern)):
            stale.append(f"{entry('NO_TEST_FILE', key)}: src/llmgw/{name} has {where.relative_to(ROOT)}/{pattern} now: "
                         "take it off NO_TEST_FILE")
    assert stale == []


def test_a_module_without_tests_is_named_with_where_they_belong(tmp_path: Path):
    package = tmp_path / "src" / "pkg"
    (package / "inner").mkdir(parents=True)
    (package / "inner" / "shape.py").write_text("")
    (package / "inner" / "found.py").write_text("")
    (tmp_path / "tests" / "inner").mkdir(parents=True)
    (tmp_path / "tests" / "inner" / "test_found_twice.py").write_text("")
    assert untested(package, tmp_path / "tests", set()) == [
        "src/pkg/inner/shape.py:1: no tests/inner/test_shape*.py tests it: write it there"
    ]
    assert untested(package, tmp_path / "tests", {"inner/shape.py"}) == []
