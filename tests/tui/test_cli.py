"""`llmgw-tui` refuses, in a sentence and an exit code, whatever would leave it an empty dashboard."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest

from tests.support.cluster import environment

pytestmark = pytest.mark.integration


def tui(*args: str, env: dict[str, str] | None = None, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "llmgw.tui", *args], capture_output=True, text=True,
        env=env or environment(), stdin=subprocess.DEVNULL, timeout=60, cwd=cwd,
    )


def flags(cluster, cert: str = "alice", ca: str | None = None) -> list[str]:
    pki = cluster.pki
    return ["--hub", cluster.hub, "--ca", ca or str(pki / "ca.crt"),
            "--cert", str(pki / f"{cert}.crt"), "--key", str(pki / f"{cert}.key")]


def assert_refused(out: subprocess.CompletedProcess, code: int, *words: str) -> None:
    assert out.returncode == code, (out.returncode, out.stderr)
    assert "Traceback" not in out.stderr, out.stderr
    assert out.stderr.startswith("llmgw-tui: "), out.stderr
    for word in words:
        assert word in out.stderr, out.stderr
    assert "\x1b[" not in out.stdout, "the screen was never taken over"


def test_without_settings_it_says_which_are_missing_and_where_to_give_them(tmp_path):
    env = environment(HOME=str(tmp_path), XDG_CONFIG_HOME="")
    for variable in ("LLMGW_CA", "LLMGW_CERT", "LLMGW_KEY"):
        env.pop(variable, None)
    out = tui(env=env, cwd=tmp_path)
    assert_refused(out, 2, "hub, tls.ca, tls.cert and tls.key are not set", "--cert", "LLMGW_CERT",
                   str(tmp_path / ".config" / "llmgw" / "ctl.yaml"))
    assert "make run" not in out.stderr


def test_a_node_certificate_is_refused_with_what_to_use_instead(cluster):
    cluster.start_server()
    out = tui(*flags(cluster, cert="node01"))
    assert_refused(out, 4, "does not let", "operator certificate", "llmgw pki issue")


def test_a_certificate_from_another_ca_is_a_tls_refusal(cluster, other_pki):
    cluster.start_server()
    out = tui(*flags(cluster), "--ca", str(other_pki / "ca.crt"))
    assert_refused(out, 3, "TLS handshake failed", "cluster CA")


def test_no_server_is_a_sentence_too(cluster):
    out = tui(*flags(cluster))
    assert_refused(out, 3, "connection refused")


def test_help_names_the_settings():
    out = tui("--help")
    assert out.returncode == 0
    for flag in ("--hub", "--ca", "--cert", "--key", "--config", "LLMGW_HUB", "ctl.yaml"):
        assert flag in out.stdout


def test_in_a_checkout_make_run_started_it_names_the_settings_make_run_wrote(cluster, tmp_path):
    """Bare ``llmgw-tui`` and ``llmgw ctl`` say the same: give run/ctl.yaml, and how; as said, it works."""
    home = tmp_path / "home"
    env = environment(HOME=str(home), XDG_CONFIG_HOME="")
    for variable in ("LLMGW_HUB", "LLMGW_CA", "LLMGW_CERT", "LLMGW_KEY"):
        env.pop(variable, None)
    checkout = tmp_path / "checkout"
    (checkout / "run").mkdir(parents=True)
    pki = cluster.pki
    (checkout / "run" / "ctl.yaml").write_text(
        f'hub: "{cluster.hub}"\ntls: {{ca: {pki / "ca.crt"}, cert: {pki / "alice.crt"}, key: {pki / "alice.key"}}}\n')

    out = tui(env=env, cwd=checkout)
    assert_refused(out, 2, "are not set", "`make run` wrote run/ctl.yaml here: llmgw-tui --config run/ctl.yaml")

    ctl = subprocess.run([sys.executable, "-m", "llmgw", "ctl", "nodes"], capture_output=True, text=True, env=env,
                         cwd=checkout, timeout=60)
    assert ctl.returncode == 2, ctl.stderr
    said = "`make run` wrote run/ctl.yaml here: llmgw ctl --config run/ctl.yaml nodes"
    assert said in ctl.stderr, ctl.stderr
    cluster.start_server()
    again = subprocess.run([sys.executable, "-m", "llmgw", *said.split(": ", 1)[1].split()[1:]], capture_output=True,
                           text=True, env=env, cwd=checkout, timeout=60)
    assert again.returncode == 0, again.stderr


def test_the_dashboard_command_the_make_run_banner_prints_runs_as_printed():
    from llmgw import devrun

    out = subprocess.run([*shlex.split(devrun.tui_command()), "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("llmgw-tui "), (out.stdout, out.stderr)
