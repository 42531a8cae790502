"""server.yaml's history: where the journal goes by default, a path read as tls.* is, and bounds that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.config import load_server_config
from llmgw.errors import ConfigError

SERVER = 'listen: {link: "ssl:7443"}\ntls: {ca: ca.crt, cert: server.crt, key: server.key}\n'


def test_without_a_dir_the_journal_goes_beside_server_yaml(confdir: Path) -> None:
    (confdir / "server.yaml").write_text(SERVER)
    history = load_server_config("server.yaml").history
    assert history.dir is None
    assert history.where(str(confdir / "server.yaml")) == str(confdir / "history")
    assert (history.journal_entries, history.journal_files, history.series_bucket_s) == (10_000, 3, 10.0)


def test_a_relative_dir_is_read_from_server_yamls_directory(confdir: Path) -> None:
    (confdir / "server.yaml").write_text(SERVER + "history: {dir: state/journal, journal_entries: 500}\n")
    config = load_server_config("server.yaml")
    assert config.history.where(config.path) == str(confdir / "state" / "journal")
    assert config.history.journal_entries == 500


@pytest.mark.parametrize("line, expected", [
    ("history: {journal_entries: 5}", "server.yaml:3: history.journal_entries: must be an integer >= 100, got 5"),
    ("history: {journal_file_bytes: 1000}",
     "server.yaml:3: history.journal_file_bytes: must be an integer >= 65536, got 1000"),
    ("history: {dir: ''}", "server.yaml:3: history.dir: empty path"),
    ("history: {journal_refill_s: -1}", "server.yaml:3: history.journal_refill_s: must be a number >= 0, got -1"),
    ("history: {jornal_files: 2}", "server.yaml:3: history.jornal_files: unknown key; did you mean 'journal_files'?"),
])
def test_a_bad_value_is_refused_naming_the_key(confdir: Path, line: str, expected: str) -> None:
    (confdir / "server.yaml").write_text(SERVER + line + "\n")
    with pytest.raises(ConfigError) as refused:
        load_server_config("server.yaml")
    assert str(refused.value).startswith(expected)
