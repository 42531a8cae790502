"""`llmgw pki` on the command line: its output, its exit codes, and in a real process."""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID

from llmgw import pki

SRC = Path(pki.__file__).resolve().parents[2]


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _subject(cert: x509.Certificate, oid: x509.ObjectIdentifier) -> list[str]:
    return [a.value for a in cert.subject.get_attributes_for_oid(oid)]


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


# -- the command line ---------------------------------------------------------


@pytest.fixture
def llmgw(monkeypatch: pytest.MonkeyPatch):
    """`llmgw.cli.main`, with a stand-in for `llmgw ctl` while that is not written yet."""
    try:
        import llmgw.ctl.main  # noqa: F401
    except ModuleNotFoundError as e:
        if e.name != "llmgw.ctl.main":
            raise
        stand_in = types.ModuleType("llmgw.ctl.main")
        stand_in.add_parser = lambda subparsers: None
        monkeypatch.setitem(sys.modules, "llmgw.ctl.main", stand_in)
    from llmgw.cli import main

    return main


def test_cli_init_then_refuses_again(llmgw, tmp_path: Path, capsys) -> None:
    directory = tmp_path / "pki"

    assert llmgw(["pki", "init", str(directory), "--name", "prod", "--days", "400"]) == 0
    out = capsys.readouterr().out
    assert f"{directory}/ca.crt" in out and f"{directory}/ca.key" in out
    assert "never copy it to a node" in out
    ca = _cert(directory / "ca.crt")
    assert _subject(ca, NameOID.ORGANIZATION_NAME) == ["prod"]
    assert ca.not_valid_after_utc - ca.not_valid_before_utc == datetime.timedelta(days=400, hours=1)

    before = _snapshot(directory)
    assert llmgw(["pki", "init", str(directory)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"llmgw: {directory}/ca.key already exists; a cluster has one CA.")
    assert _snapshot(directory) == before


def test_cli_issue_node_prints_where_and_the_agent_tls_line(llmgw, tmp_path: Path, capsys) -> None:
    directory = tmp_path / "pki"
    pki.init_ca(directory)

    assert llmgw(["pki", "issue", str(directory), "--role", "node", "node05"]) == 0
    out = capsys.readouterr().out
    assert f"wrote {directory}/node05.crt and {directory}/node05.key" in out
    tls = "tls: {ca: /etc/llmgw/ca.crt, cert: /etc/llmgw/node.crt, key: /etc/llmgw/node.key}"
    assert tls in out
    assert len(out.splitlines()) == 2

    assert llmgw(["pki", "issue", str(directory), "--role", "node", "node05"]) == 1
    assert "--force" in capsys.readouterr().err

    assert llmgw(["pki", "issue", str(directory), "--role", "node", "node05", "--force"]) == 0


def test_cli_issue_server_with_sans_and_days(llmgw, tmp_path: Path, capsys) -> None:
    directory = tmp_path / "pki"
    pki.init_ca(directory)

    argv = ["pki", "issue", str(directory), "--role", "server", "hub",
            "--san", "cp.example.org", "--san", "10.0.0.5", "--days", "90"]
    assert llmgw(argv) == 0
    out = capsys.readouterr().out
    assert "(DNS:hub, DNS:cp.example.org, IP:10.0.0.5)" in out
    assert f"cert: {directory}/hub.crt" in out
    cert = _cert(directory / "hub.crt")
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert lifetime == datetime.timedelta(days=90, hours=1)


def test_cli_refusals_exit_non_zero(llmgw, tmp_path: Path, capsys) -> None:
    directory = tmp_path / "pki"
    pki.init_ca(directory)

    assert llmgw(["pki", "issue", str(directory), "--role", "node", "../x"]) == 1
    assert "not a usable certificate name" in capsys.readouterr().err
    assert llmgw(["pki", "issue", str(tmp_path / "none"), "--role", "node", "x"]) == 1
    assert "llmgw pki init" in capsys.readouterr().err
    for argv in (
        ["pki", "issue", str(directory), "--role", "agent", "x"],
        ["pki", "issue", str(directory), "x"],
        ["pki", "issue", str(directory), "--role", "node", "x", "--days", "0"],
    ):
        with pytest.raises(SystemExit) as exit:
            llmgw(argv)
        assert exit.value.code == 2
    assert sorted(p.name for p in directory.iterdir()) == ["ca.crt", "ca.key"]


def test_pki_commands_stand_alone_on_a_parser_of_their_own(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser(prog="llmgw")
    from llmgw.pki import commands

    commands.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["pki", "issue", str(tmp_path), "--role", "router", "r1",
                              "--san", "a", "--san", "b"])
    assert (args.role, args.name, args.san) == ("router", "r1", ["a", "b"])
    assert (args.days, args.force) == (825, False)
    assert parser.parse_args(["pki", "init", str(tmp_path)]).days == 3650


def test_python_m_llmgw_pki_in_a_real_process(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(SRC)}

    def run(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "llmgw", "pki", *argv],
            env=env, capture_output=True, text=True, timeout=60,
        )

    directory = tmp_path / "pki"
    assert run("init", str(directory)).returncode == 0
    assert run("issue", str(directory), "--role", "operator", "alice").returncode == 0
    again = run("init", str(directory))
    assert again.returncode == 1 and "already exists" in again.stderr
    assert "Traceback" not in again.stderr
    _cert(directory / "alice.crt").verify_directly_issued_by(_cert(directory / "ca.crt"))
