"""ctl.yaml, and which hub and certificate `llmgw ctl` ends up with."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.config import (
    CtlSettings,
    CtlTLSFiles,
    TLSFiles,
    default_ctl_config_path,
    load_ctl_config,
    resolve_ctl_settings,
)
from llmgw.errors import ConfigError

FILE_HUB = "wss://from-file.example.org:7443/"
ENV_HUB = "wss://from-env.example.org:7443/"
FLAG_HUB = "wss://from-flag.example.org:7443/"


@pytest.fixture
def operator(confdir: Path) -> Path:
    """Three sets of TLS files, one per source, and a ctl.yaml under $XDG_CONFIG_HOME."""
    for source in ("file", "env", "flag"):
        (confdir / source).mkdir()
        for name in ("ca.crt", "op.crt", "op.key"):
            (confdir / source / name).write_text("")
    (confdir / "xdg" / "llmgw").mkdir(parents=True)
    (confdir / "xdg" / "llmgw" / "ctl.yaml").write_text(
        f'hub: "{FILE_HUB}"\n'
        "tls: {ca: ../../file/ca.crt, cert: ../../file/op.crt, key: ../../file/op.key}\n"
    )
    return confdir


def settings(base: Path, source: str, hub: str) -> CtlSettings:
    return CtlSettings(
        hub=hub,
        tls=TLSFiles(
            ca=str(base / source / "ca.crt"),
            cert=str(base / source / "op.crt"),
            key=str(base / source / "op.key"),
        ),
    )


def env_for(base: Path, **extra: str) -> dict[str, str]:
    return {"XDG_CONFIG_HOME": str(base / "xdg"), "HOME": str(base / "home"), **extra}


def full_env(base: Path) -> dict[str, str]:
    return env_for(
        base,
        LLMGW_HUB=ENV_HUB,
        LLMGW_CA=str(base / "env/ca.crt"),
        LLMGW_CERT=str(base / "env/op.crt"),
        LLMGW_KEY=str(base / "env/op.key"),
    )


def test_the_file_alone(operator: Path) -> None:
    assert resolve_ctl_settings(environ=env_for(operator)) == settings(operator, "file", FILE_HUB)


def test_the_environment_wins_over_the_file(operator: Path) -> None:
    assert resolve_ctl_settings(environ=full_env(operator)) == settings(operator, "env", ENV_HUB)


def test_flags_win_over_the_environment(operator: Path) -> None:
    result = resolve_ctl_settings(
        hub=FLAG_HUB,
        ca="flag/ca.crt",  # relative to the working directory, as a shell user expects
        cert=str(operator / "flag/op.crt"),
        key=str(operator / "flag/op.key"),
        environ=full_env(operator),
    )
    assert result == settings(operator, "flag", FLAG_HUB)


def test_each_setting_is_resolved_on_its_own(operator: Path) -> None:
    result = resolve_ctl_settings(
        key="flag/op.key", environ=env_for(operator, LLMGW_CERT=str(operator / "env/op.crt"))
    )
    assert result == CtlSettings(
        hub=FILE_HUB,
        tls=TLSFiles(
            ca=str(operator / "file/ca.crt"),
            cert=str(operator / "env/op.crt"),
            key=str(operator / "flag/op.key"),
        ),
    )


def test_an_empty_variable_counts_as_unset(operator: Path) -> None:
    result = resolve_ctl_settings(environ=env_for(operator, LLMGW_HUB=""))
    assert result.hub == FILE_HUB


def test_without_xdg_config_home_the_file_is_under_home(operator: Path) -> None:
    home = operator / "home"
    (home / ".config" / "llmgw").mkdir(parents=True)
    (home / ".config" / "llmgw" / "ctl.yaml").write_text(
        f'hub: "{FILE_HUB}"\ntls: {{ca: ../../../file/ca.crt, cert: ../../../file/op.crt, '
        "key: ../../../file/op.key}\n"
    )
    result = resolve_ctl_settings(environ={"HOME": str(home)})
    assert result == settings(operator, "file", FILE_HUB)
    # A relative XDG_CONFIG_HOME is to be ignored, says the XDG spec.
    assert default_ctl_config_path({"HOME": str(home), "XDG_CONFIG_HOME": "rel"}) == str(
        home / ".config/llmgw/ctl.yaml"
    )


def test_a_missing_default_file_is_fine_when_everything_else_is_given(operator: Path) -> None:
    env = full_env(operator)
    env["XDG_CONFIG_HOME"] = str(operator / "nowhere")
    assert resolve_ctl_settings(environ=env) == settings(operator, "env", ENV_HUB)


def test_a_missing_file_given_on_purpose_is_an_error(operator: Path) -> None:
    with pytest.raises(ConfigError) as e:
        resolve_ctl_settings(environ=full_env(operator), config_path="team-ctl.yaml")
    assert str(e.value) == "team-ctl.yaml: cannot read: No such file or directory"


def test_an_explicit_file_replaces_the_default_one(operator: Path) -> None:
    """The default ctl.yaml (which has everything) is not consulted behind team.yaml's back."""
    (operator / "team.yaml").write_text(f'hub: "{ENV_HUB}"\n')
    with pytest.raises(ConfigError, match=r"^tls\.ca, tls\.cert and tls\.key are not set"):
        resolve_ctl_settings(environ=env_for(operator), config_path="team.yaml")
    result = resolve_ctl_settings(
        ca="env/ca.crt",
        environ=env_for(
            operator, LLMGW_CERT=str(operator / "env/op.crt"), LLMGW_KEY=str(operator / "env/op.key")
        ),
        config_path=operator / "team.yaml",
    )
    assert result == settings(operator, "env", ENV_HUB)


def test_what_is_missing_is_named_with_the_three_ways_to_give_it(operator: Path) -> None:
    (operator / "team.yaml").write_text(f'hub: "{ENV_HUB}"\ntls: {{ca: file/ca.crt}}\n')
    with pytest.raises(ConfigError) as e:
        resolve_ctl_settings(
            environ=env_for(operator, LLMGW_KEY=str(operator / "env/op.key")),
            config_path="team.yaml",
        )
    assert str(e.value) == (
        "tls.cert is not set; give it as a flag (--cert), in the environment (LLMGW_CERT) "
        "or in team.yaml (tls.cert:)"
    )


def test_nothing_anywhere(confdir: Path) -> None:
    with pytest.raises(ConfigError) as e:
        resolve_ctl_settings(environ={"HOME": str(confdir)})
    assert str(e.value) == (
        "hub, tls.ca, tls.cert and tls.key are not set; give each as a flag (--hub, --ca, "
        "--cert, --key), in the environment (LLMGW_HUB, LLMGW_CA, LLMGW_CERT, LLMGW_KEY) or "
        f"in {confdir}/.config/llmgw/ctl.yaml (hub:, tls.ca:, tls.cert:, tls.key:)"
    )


@pytest.mark.parametrize(
    "flags, env, message",
    [
        (
            {"hub": "https://cp:7443/"},
            {},
            "--hub 'https://cp:7443/': the hub URL must start with wss:// (the link is always "
            "TLS); write it like 'wss://cp.example.org:7443/'",
        ),
        (
            {},
            {"LLMGW_HUB": "wss://cp/"},
            "LLMGW_HUB 'wss://cp/': the hub URL has no port; add the port of server.yaml's "
            "listen.link, like 'wss://cp.example.org:7443/'",
        ),
        (
            {"ca": "nope.crt"},
            {},
            "--ca 'nope.crt': file does not exist: {dir}/nope.crt; fix the path",
        ),
        (
            {},
            {"LLMGW_KEY": "flag"},
            "LLMGW_KEY 'flag': not a regular file: {dir}/flag; fix the path",
        ),
    ],
)
def test_flags_and_variables_are_checked_like_the_file(
    operator: Path, flags: dict[str, str], env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as e:
        resolve_ctl_settings(environ=env_for(operator, **env), **flags)
    assert str(e.value) == message.replace("{dir}", str(operator))


def test_a_broken_ctl_yaml_is_reported_with_its_line(operator: Path) -> None:
    path = operator / "xdg/llmgw/ctl.yaml"
    path.write_text(f'hub: "{FILE_HUB}"\ntls: {{ca: ../../file/ca.crt, crt: x}}\n')
    with pytest.raises(ConfigError) as e:
        resolve_ctl_settings(environ=env_for(operator))
    assert str(e.value) == (
        f"{path}:2: tls.crt: unknown key; did you mean 'cert'? allowed here: ca, cert, key"
    )


def test_load_ctl_config_keeps_what_is_there(operator: Path) -> None:
    (operator / "ctl.yaml").write_text("tls: {cert: file/op.crt}\n")
    config = load_ctl_config("ctl.yaml")
    assert config.hub is None
    assert config.tls == CtlTLSFiles(cert=str(operator / "file/op.crt"))
    (operator / "empty.yaml").write_text("")
    assert load_ctl_config("empty.yaml").tls == CtlTLSFiles()


def test_settings_parse_the_hub(operator: Path) -> None:
    result = resolve_ctl_settings(environ=env_for(operator))
    assert (result.hub_host, result.hub_port) == ("from-file.example.org", 7443)
