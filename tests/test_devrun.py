"""What `make run` tells a newcomer to type works when typed.

The banner said ``llmgw ctl …``, but `make run` installs llmgw into .venv,
which is not on PATH: the first command a newcomer tried was "command not
found".
"""

from __future__ import annotations

import shlex
import subprocess

from llmgw import __version__, devrun


def test_the_ctl_command_in_the_banner_runs_as_printed() -> None:
    out = subprocess.run([*shlex.split(devrun.llmgw_command()), "--version"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"llmgw {__version__}"


def test_the_activate_hint_names_a_script_that_exists() -> None:
    hint = devrun.activate_hint()
    if hint:  # a Python outside a venv has none to give
        script = hint.split("`. ", 1)[1].split("`", 1)[0]
        out = subprocess.run(["bash", "-c", f". {shlex.quote(script)} && command -v llmgw"],
                             capture_output=True, text=True)
        assert out.returncode == 0 and out.stdout.strip().endswith("/llmgw"), out.stderr
