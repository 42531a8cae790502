"""ctl.yaml, and how `llmgw ctl` and the TUI decide which hub and certificate to use.

Each setting comes from the first of: a command-line flag, an environment
variable, the config file.  The file is optional and may hold only some
settings (a shared operator workstation might set the hub in the file and each
person's certificate in their environment), so every key in it is optional;
what is still missing after all three is an error that names the three ways.
"""

from __future__ import annotations

import os
from typing import Mapping

import attrs

from llmgw.config.common import HUB_URL
from llmgw.config.schema import File, Loader, Nullable, section
from llmgw.config.yamlpos import read_document
from llmgw.errors import ConfigError
from llmgw.huburl import parse_hub_url
from llmgw.setting import setting
from llmgw.tlsfiles import TLSFiles


@attrs.frozen
class CtlTLSFiles:
    """Whichever of the operator's TLS files ctl.yaml names, as absolute paths."""

    ca: str | None = setting(None, kind=Nullable(File()))
    cert: str | None = setting(None, kind=Nullable(File()))
    key: str | None = setting(None, kind=Nullable(File()))


@attrs.frozen
class CtlConfig:
    """The whole of ctl.yaml; ``path`` is the file it came from, absolute."""

    path: str
    hub: str | None = setting(None, kind=Nullable(HUB_URL))
    tls: CtlTLSFiles = setting(factory=CtlTLSFiles)


@attrs.frozen
class CtlSettings:
    """What a ctl or TUI session needs: the hub's URL and the operator's TLS files."""

    hub: str
    tls: TLSFiles

    @property
    def hub_host(self) -> str:
        return parse_hub_url(self.hub).host

    @property
    def hub_port(self) -> int:
        return parse_hub_url(self.hub).port


SCHEMA = section(CtlConfig)


def load_ctl_config(path: str | os.PathLike[str]) -> CtlConfig:
    """Read ctl.yaml at *path*; raise ``ConfigError`` naming file, line and key."""
    document = read_document(path)
    full = os.path.abspath(os.fspath(path))
    if document.root is None:
        # An empty file sets nothing; the flags and environment may set it all.
        return CtlConfig(path=full)
    return SCHEMA.build(Loader(document), document.root, (), path=full)


def default_ctl_config_path(environ: Mapping[str, str] = os.environ) -> str:
    """``$XDG_CONFIG_HOME/llmgw/ctl.yaml``, else ``~/.config/llmgw/ctl.yaml``."""
    base = environ.get("XDG_CONFIG_HOME", "")
    if not os.path.isabs(base):
        # The XDG spec says to ignore a relative XDG_CONFIG_HOME.
        home = environ.get("HOME") or os.path.expanduser("~")
        base = os.path.join(home, ".config")
    return os.path.join(base, "llmgw", "ctl.yaml")


# setting, flag, environment variable, key in ctl.yaml
_SETTINGS = (
    ("hub", "--hub", "LLMGW_HUB", "hub"),
    ("ca", "--ca", "LLMGW_CA", "tls.ca"),
    ("cert", "--cert", "LLMGW_CERT", "tls.cert"),
    ("key", "--key", "LLMGW_KEY", "tls.key"),
)


def resolve_ctl_settings(
    hub: str | None = None,
    ca: str | None = None,
    cert: str | None = None,
    key: str | None = None,
    environ: Mapping[str, str] = os.environ,
    config_path: str | os.PathLike[str] | None = None,
) -> CtlSettings:
    """Flags win over ``LLMGW_*`` environment variables, which win over ctl.yaml.

    A missing default ctl.yaml is fine; a missing *config_path* given on
    purpose is an error, as is any value that names no file or no valid hub.
    An empty flag or variable counts as not given.
    """
    flags = {"hub": hub, "ca": ca, "cert": cert, "key": key}
    chosen: dict[str, str] = {}
    for setting, flag, variable, _ in _SETTINGS:
        if flags[setting]:
            chosen[setting] = _check(setting, flags[setting], flag)  # type: ignore[arg-type]
        elif environ.get(variable):
            chosen[setting] = _check(setting, environ[variable], variable)
    path = os.fspath(config_path) if config_path is not None else default_ctl_config_path(environ)
    complete = len(chosen) == len(_SETTINGS)
    if config_path is not None or (not complete and os.path.exists(path)):
        config = load_ctl_config(path)
        from_file = {
            "hub": config.hub,
            "ca": config.tls.ca,
            "cert": config.tls.cert,
            "key": config.tls.key,
        }
        for setting, value in from_file.items():
            if setting not in chosen and value is not None:
                chosen[setting] = value
    missing = [s for s in _SETTINGS if s[0] not in chosen]
    if missing:
        names = [s[3] for s in missing]
        listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
        raise ConfigError(
            f"{listed} {'is' if len(names) == 1 else 'are'} not set; give "
            f"{'it' if len(missing) == 1 else 'each'} as a flag "
            f"({', '.join(s[1] for s in missing)}), in the environment "
            f"({', '.join(s[2] for s in missing)}) or in {path} "
            f"({', '.join(s[3] + ':' for s in missing)})"
        )
    return CtlSettings(hub=chosen["hub"], tls=TLSFiles(ca=chosen["ca"], cert=chosen["cert"], key=chosen["key"]))


def _check(setting: str, value: str, origin: str) -> str:
    """A flag's or variable's value, checked as the file's would be; paths made absolute."""
    if setting == "hub":
        try:
            parse_hub_url(value)
        except ValueError as e:
            raise ConfigError(f"{origin} {value!r}: {e}") from None
        return value
    full = os.path.abspath(os.path.expanduser(value))
    if not os.path.isfile(full):
        why = "not a regular file" if os.path.exists(full) else "file does not exist"
        raise ConfigError(f"{origin} {value!r}: {why}: {full}; fix the path")
    return full
