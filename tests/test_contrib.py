"""contrib/'s systemd units, its agent.yaml and docs/operations.rst describe one layout.

The units once ran /usr/local/bin/twistd as a user nothing created, in a
directory nothing made, while the docs installed into /opt/llmgw.  These
tests read the units and the install commands in docs/operations.rst and
check that every path and user a unit needs is one the commands create.
And every twistd command in the docs names its pidfile: two without one in
the same directory collide on twistd.pid.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from llmgw.config.agent import DEFAULT_STATE_DIR, DEFAULT_WEIGHTS_DIRS
from tests.config.test_config_examples import load_agent_example

ROOT = Path(__file__).resolve().parents[1]
UNITS = sorted((ROOT / "contrib").glob("*.service"))


def service_section(path: Path) -> dict[str, str]:
    """The [Service] keys of a unit (each key once here, so a dict will do)."""
    keys, section = {}, None
    for line in path.read_text().splitlines():
        if line.startswith("["):
            section = line.strip("[]")
        elif section == "Service" and "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            keys[key] = value
    return keys


def install_commands() -> list[str]:
    """The shell commands in docs/operations.rst's Install section, one per line."""
    text = (ROOT / "docs" / "operations.rst").read_text()
    section = text.split("\nInstall\n=======\n", 1)[1].split("\nTrying it on one machine\n", 1)[0]
    return [line.strip().split("  #")[0].strip() for line in section.splitlines() if line.startswith("    ")]


def created(owner: str) -> set[str]:
    """Directories the install commands make with *owner* as user or group."""
    made = set()
    for command in install_commands():
        words = command.split()
        if words[:2] == ["install", "-d"] and (f"-o {owner}" in command or f"-g {owner}" in command):
            made.update(w for w in words[2:] if w.startswith("/"))
    return made


def test_there_are_units_to_check() -> None:
    assert {u.name for u in UNITS} == {"llmgw-agent.service", "llmgw-server.service"}


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_a_unit_runs_what_the_install_section_creates(unit: Path) -> None:
    keys = service_section(unit)
    commands = install_commands()
    user = keys["User"]
    assert keys["Group"] == user
    assert any(c.startswith("useradd --system") and c.split()[-1] == user for c in commands), commands
    argv = keys["ExecStart"].split()
    venv = Path(argv[0]).parent.parent
    assert argv[0] == f"{venv}/bin/twistd" and f"python3 -m venv {venv}" in commands
    assert f"{venv}/bin/pip install" in " ".join(commands)
    assert keys["WorkingDirectory"] in created(user)
    config = Path(argv[argv.index("--config") + 1])
    assert str(config.parent) in created(user)
    assert "--pidfile=" in argv


def test_the_agent_example_keeps_its_state_and_weights_where_the_install_section_makes_them(tmp_path: Path) -> None:
    config = load_agent_example(tmp_path)
    agent_unit = service_section(ROOT / "contrib" / "llmgw-agent.service")
    made = created(agent_unit["User"])
    assert config.state_dir == agent_unit["WorkingDirectory"] == DEFAULT_STATE_DIR
    assert config.weights_dirs[0] == DEFAULT_WEIGHTS_DIRS[0]
    assert {config.state_dir, *DEFAULT_WEIGHTS_DIRS} <= made


# twistd, its own options, then the plugin and its --config: a command, not a mention.
TWISTD_COMMAND = re.compile(r"twistd((?:\s+-[^\s`]+)*)\s+llmgw-(?:server|agent|router)\s+(?:--config|-c)\b")


def test_every_twistd_command_in_the_docs_names_its_pidfile() -> None:
    documents = [ROOT / "README.rst", *sorted((ROOT / "docs").glob("*.rst")), *sorted((ROOT / "contrib").iterdir())]
    commands = [(path.name, m.group(0)) for path in documents for m in TWISTD_COMMAND.finditer(path.read_text())]
    assert len(commands) >= 8, commands
    assert [c for c in commands if "--pidfile" not in c[1]] == []


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_a_unit_gives_its_process_room_for_connections(unit: Path) -> None:
    """systemd's default soft limit (1024) is what let API clients lock agents out of the hub."""
    limit = service_section(unit).get("LimitNOFILE")
    assert limit is not None and int(limit) >= 65536, f"{unit.name}: LimitNOFILE={limit}"
