"""What a configuration path may be before any of it is parsed: a regular file, of a bounded size.

A FIFO named as server.yaml used to block the process (and a reload, the
reactor) forever, a device was read as if it were YAML, and a 50 MB file took
a minute to parse on the reactor.  Tags on mappings and lists were ignored,
though the documentation says tags are refused.
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from llmgw.config import load_agent_config, load_server_config
from llmgw.config import yamlpos
from llmgw.errors import ConfigError

SERVER = """\
listen:
  link: "ssl:7443"
tls: {ca: ca.crt, cert: server.crt, key: server.key}
"""


def test_a_file_over_the_limit_is_refused_with_its_size_before_parsing(confdir: Path, monkeypatch) -> None:
    padding = "# " + "x" * 100 + "\n"
    text = SERVER + padding * (yamlpos.MAX_CONFIG_BYTES // len(padding) + 1)
    (confdir / "server.yaml").write_text(text)
    monkeypatch.setattr(yamlpos, "parse_document", lambda *a: pytest.fail("parsed a file over the limit"))

    with pytest.raises(ConfigError) as refused:
        load_server_config("server.yaml")

    size = len(text.encode())
    assert str(refused.value) == (
        f"server.yaml: the file is {size} bytes, more than the {yamlpos.MAX_CONFIG_BYTES} bytes (256 KiB) "
        f"a configuration file may be: check that it is the right file, or raise {yamlpos.MAX_CONFIG_ENV} "
        "in the environment of the process that reads it"
    )


def test_the_limit_is_set_from_the_environment(confdir: Path, monkeypatch) -> None:
    (confdir / "server.yaml").write_text(SERVER)
    monkeypatch.setenv(yamlpos.MAX_CONFIG_ENV, "50")
    with pytest.raises(ConfigError, match=f"the file is {len(SERVER)} bytes, more than the 50 bytes"):
        load_server_config("server.yaml")

    monkeypatch.setenv(yamlpos.MAX_CONFIG_ENV, str(len(SERVER)))
    assert load_server_config("server.yaml").listen.link == "ssl:7443"


@pytest.mark.parametrize("value", ["", "lots", "0", "-5", "1.5"])
def test_an_unusable_limit_in_the_environment_is_refused(confdir: Path, monkeypatch, value: str) -> None:
    (confdir / "server.yaml").write_text(SERVER)
    monkeypatch.setenv(yamlpos.MAX_CONFIG_ENV, value)
    with pytest.raises(ConfigError, match=f"{yamlpos.MAX_CONFIG_ENV}={value!r} is not a whole number of bytes"):
        load_server_config("server.yaml")


def test_a_file_that_grows_past_the_limit_while_being_read_is_refused(confdir: Path, monkeypatch) -> None:
    (confdir / "server.yaml").write_text(SERVER)
    monkeypatch.setenv(yamlpos.MAX_CONFIG_ENV, str(len(SERVER)))
    real_fstat = os.fstat

    def grown(fd):
        # The size the stat saw; the file then gets longer before it is read.
        with open("server.yaml", "a") as f:
            f.write("# more\n")
        return real_fstat(fd)

    monkeypatch.setattr(yamlpos.os, "fstat", grown)
    with pytest.raises(ConfigError, match="more than the"):
        load_server_config("server.yaml")


class _Writer:
    """Opens a FIFO for writing and writes a whole config into it, as an attacker or a mistaken script would."""

    def __init__(self, fifo: Path, text: str) -> None:
        self.fifo = fifo
        self.thread = threading.Thread(target=self._write, args=(text,), daemon=True)
        self.thread.start()

    def _write(self, text: str) -> None:
        fd = os.open(self.fifo, os.O_WRONLY)  # blocks until a reader opens it
        try:
            os.write(fd, text.encode())
        except BrokenPipeError:
            pass
        finally:
            os.close(fd)

    def release(self) -> None:
        # A reader of our own lets a writer that nobody read from finish.
        fd = os.open(self.fifo, os.O_RDONLY | os.O_NONBLOCK)
        try:
            self.thread.join(10)
        finally:
            os.close(fd)
        assert not self.thread.is_alive()


def test_a_fifo_as_server_yaml_is_refused_without_opening_it(confdir: Path) -> None:
    fifo = confdir / "server.yaml"
    os.mkfifo(fifo)
    writer = _Writer(fifo, SERVER)
    try:
        with pytest.raises(ConfigError) as refused:
            load_server_config("server.yaml")
    finally:
        writer.release()
    assert str(refused.value) == (
        "server.yaml: is a FIFO (a named pipe), not a regular file; "
        "name the configuration file itself"
    )


def test_a_path_swapped_for_a_fifo_after_the_check_is_refused_without_blocking(confdir: Path, monkeypatch) -> None:
    (confdir / "regular.yaml").write_text(SERVER)
    os.mkfifo(confdir / "server.yaml")
    regular = os.stat(confdir / "regular.yaml")
    real_stat = os.stat
    monkeypatch.setattr(yamlpos.os, "stat", lambda p, *a, **kw: regular if str(p) == "server.yaml" else real_stat(p, *a, **kw))
    # The writer only keeps a reader that blocks (today's) from hanging the suite.
    writer = _Writer(confdir / "server.yaml", SERVER)
    try:
        with pytest.raises(ConfigError, match="server.yaml: is a FIFO"):
            load_server_config("server.yaml")
    finally:
        writer.release()


@pytest.mark.parametrize("path, kind", [
    ("/dev/null", "a character device"),
    (".", "a directory"),
])
def test_a_device_or_a_directory_is_refused_with_what_it_is(confdir: Path, path: str, kind: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load_agent_config(path)
    assert str(refused.value) == f"{path}: is {kind}, not a regular file; name the configuration file itself"


def test_a_symlink_to_a_regular_file_is_read(confdir: Path) -> None:
    (confdir / "real.yaml").write_text(SERVER)
    (confdir / "server.yaml").symlink_to("real.yaml")
    assert stat.S_ISLNK(os.lstat(confdir / "server.yaml").st_mode)
    assert load_server_config("server.yaml").listen.link == "ssl:7443"


@pytest.mark.parametrize("text, message", [
    (
        'listen: {link: "ssl:7443"}\ntls: !files {ca: ca.crt, cert: server.crt, key: server.key}\n',
        "server.yaml:2: tls: a mapping tagged !files; llmgw reads no tags: remove it",
    ),
    (
        SERVER + "profiles: !!set {s}\n",
        "server.yaml:4: profiles: a mapping tagged !!set; llmgw reads no tags: remove it",
    ),
    (
        SERVER + "profiles:\n  s:\n    engine: sim\n    args: !argv [--ctx, '8']\n",
        "server.yaml:7: profiles.s.args: a list tagged !argv; llmgw reads no tags: remove it",
    ),
    (
        SERVER + "profiles:\n  s:\n    engine: sim\n    args: !!omap [a: b]\n",
        "server.yaml:7: profiles.s.args: a list tagged !!omap; llmgw reads no tags: remove it",
    ),
    (
        SERVER + "profiles:\n  s: {<<: !defaults {engine: sim}}\n",
        "server.yaml:5: profiles.s: a mapping tagged !defaults; llmgw reads no tags: remove it",
    ),
    (
        SERVER + "profiles:\n  s: {<<: !many [{engine: sim}]}\n",
        "server.yaml:5: profiles.s: a list tagged !many; llmgw reads no tags: remove it",
    ),
])
def test_tags_on_mappings_and_lists_are_refused(confdir: Path, text: str, message: str) -> None:
    (confdir / "server.yaml").write_text(text)
    with pytest.raises(ConfigError) as refused:
        load_server_config("server.yaml")
    assert str(refused.value) == message


def test_the_default_tags_written_out_are_no_tags_at_all(confdir: Path) -> None:
    (confdir / "server.yaml").write_text(
        'listen: !!map {link: "ssl:7443"}\ntls: {ca: ca.crt, cert: server.crt, key: server.key}\n'
        "profiles:\n  s: {engine: sim, args: !!seq [a]}\n"
    )
    assert load_server_config("server.yaml").profiles["s"].args == ("a",)


@pytest.mark.skipif(getattr(yamlpos.yaml, "CSafeLoader", None) is None, reason="PyYAML built without libyaml")
def test_a_big_broken_file_is_not_parsed_twice(confdir: Path, monkeypatch) -> None:
    # Reading 64 KiB and more again with PyYAML for its wording would stall a reload for seconds.
    text = SERVER + "profiles:\n  s:\n    engine: sim\n    args: [" + "a," * 40000 + "]]\n"
    (confdir / "server.yaml").write_text(text)
    monkeypatch.setattr(yamlpos.yaml, "SafeLoader", None)  # a second, pure-Python parse would fail on this
    with pytest.raises(ConfigError) as refused:
        load_server_config("server.yaml")
    assert str(refused.value).startswith("server.yaml:7: (document): YAML syntax: ")
