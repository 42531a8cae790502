"""Checking Twisted server endpoint strings without listening on anything.

``serverFromString`` only complains when the server starts listening, and an
``ssl:`` string makes it read ``server.pem`` from the working directory.  This
reads the same syntax (``kind:positional:name=value``, backslash escapes the
next character) and checks what can be known from the text alone, so a typo
in ``listen:`` is a configuration error with a line number.
"""

from __future__ import annotations

import attrs

# Each kind's positional parameters in Twisted's order, then its keywords.
_PARAMETERS = {
    "tcp": ("port", "interface", "backlog"),
    "tcp6": ("port", "backlog", "interface"),
    "ssl": (
        "port",
        "privateKey",
        "certKey",
        "sslmethod",
        "interface",
        "backlog",
        "extraCertChain",
        "dhParameters",
    ),
    "unix": ("address", "mode", "backlog", "lockfile"),
}
KINDS = tuple(_PARAMETERS)

# The link's certificate and CA come from tls:, which is also what the
# agents' certificates are checked against; a second source would disagree.
TLS_FILE_OPTIONS = ("privateKey", "certKey", "extraCertChain", "caCertsDir")


@attrs.frozen
class ServerEndpoint:
    """The parts of an endpoint string: ``ssl:7443:interface=10.0.0.1``."""

    text: str
    kind: str
    port: int | None = None  # tcp, tcp6, ssl
    interface: str | None = None
    backlog: int | None = None
    address: str | None = None  # unix
    options: dict[str, str] = attrs.Factory(dict)  # everything as written


def _split(text: str) -> list[str]:
    """Split on ``:`` as Twisted does, honouring ``\\:`` escapes; keep ``=`` escapes."""
    parts, current, chars = [], "", iter(text)
    for char in chars:
        if char == "\\":
            current += char + next(chars, "")
        elif char == ":":
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return parts


def _unescape(text: str) -> str:
    out, chars = "", iter(text)
    for char in chars:
        out += next(chars, "") if char == "\\" else char
    return out


def _split_option(part: str) -> tuple[str | None, str]:
    """``name=value`` -> (name, value); a part without an unescaped ``=`` is positional."""
    escaped = False
    for i, char in enumerate(part):
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == "=":
            return _unescape(part[:i]), _unescape(part[i + 1 :])
    return None, _unescape(part)


def parse_server_endpoint(text: str) -> ServerEndpoint:
    """Read *text* as a Twisted server endpoint string, or raise ``ValueError(why)``."""
    kind, *rest = _split(text)
    if kind not in _PARAMETERS:
        raise ValueError(
            f"unknown listener kind {kind!r}; write tcp:PORT, tcp6:PORT, ssl:PORT or unix:PATH"
        )
    names = _PARAMETERS[kind]
    options: dict[str, str] = {}
    positional = 0
    for part in rest:
        name, value = _split_option(part)
        if name is None:
            if positional >= len(names):
                raise ValueError(
                    f"too many positional parts for {kind}: (it takes at most {len(names)})"
                )
            name = names[positional]
            positional += 1
        if name not in names:
            raise ValueError(f"{kind}: has no option {name!r}; its options are {', '.join(names)}")
        if name in options:
            raise ValueError(f"{name} is given twice")
        options[name] = value
    first = names[0]
    if first not in options or not options[first]:
        example = "unix:/run/llmgw/api.sock" if kind == "unix" else f"{kind}:8080"
        raise ValueError(f"no {first} given; write it like {example!r}")
    endpoint = ServerEndpoint(
        text=text,
        kind=kind,
        port=_number(options, "port", 0, 65535),
        interface=options.get("interface"),
        backlog=_number(options, "backlog", 1, None),
        address=options.get("address"),
        options=options,
    )
    return endpoint


def _number(options: dict[str, str], name: str, low: int, high: int | None) -> int | None:
    if name not in options:
        return None
    text = options[name]
    number = int(text) if text.isascii() and text.isdigit() else -1
    if number < low or (high is not None and number > high):
        limit = f"from {low} to {high}" if high is not None else f"of {low} or more"
        raise ValueError(f"{name} must be a whole number {limit}, got {text!r}")
    return number


def check_listener(text: str) -> None:
    """``ValueError`` unless *text* is an endpoint string for the API or admin listener."""
    parse_server_endpoint(text)


def check_link_listener(text: str) -> None:
    """``ValueError`` unless *text* is an ``ssl:`` endpoint whose TLS files come from ``tls:``."""
    parts = _split(text)
    if parts[0] != "ssl":
        raise ValueError(
            "the link is always mutual TLS; write it as ssl:PORT (for example 'ssl:7443')"
        )
    # Look at the names before parsing: caCertsDir= is not even an ssl: option.
    given = [name for name in (_split_option(p)[0] for p in parts[1:]) if name in TLS_FILE_OPTIONS]
    if not given:
        # ssl:7443:server.pem gives privateKey without naming it.
        options = parse_server_endpoint(text).options
        given = [name for name in TLS_FILE_OPTIONS if name in options]
    if given:
        raise ValueError(
            f"remove {', '.join(name + '=' for name in given)}: the link's certificate, key "
            "and CA come from tls: (ca, cert, key)"
        )
