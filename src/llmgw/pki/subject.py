"""What a certificate says about its holder: a name (CN, the WAMP authid) and a role (OU).

The hub believes nothing else about a peer, so :func:`identity_of` is the one
place that reads them, and :func:`name_problem` the one rule for what may be
a certificate's name.
"""

from __future__ import annotations

import datetime
import re

import attrs
from cryptography import x509
from cryptography.x509.oid import NameOID

from llmgw.errors import PKIError
from llmgw.roles import CERT_ROLES, is_node_id
# Whatever a certificate says reaches a log line through this (re-exported by llmgw.pki).
from llmgw.text import printable  # noqa: F401

# RFC 5280's upper bound on a CN, which cryptography enforces: a longer
# hostname could not be carried as an identity at all.
MAX_NAME = 64
# A node's name is one DNS label.
MAX_LABEL = 63

_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")


@attrs.frozen
class CertificateSubject:
    """Who a certificate's holder is on the link: the authid and the authrole.

    ``serial`` and ``not_after`` say which certificate proved it, and until
    when; they are not part of who the holder is, so they take no part in
    equality (a re-issued certificate proves the same identity).
    """

    name: str
    role: str
    serial: int | None = attrs.field(default=None, eq=False)
    not_after: datetime.datetime | None = attrs.field(default=None, eq=False)


def describe_subject(cert: x509.Certificate) -> str:
    """The subject of *cert* as RFC 4514 text, safe for one log line."""
    return printable(cert.subject.rfc4514_string())


def name_problem(name: str) -> str | None:
    """Why `name` cannot be a certificate's name, or None when it can.

    The name becomes a file name beside the CA and the holder's WAMP authid, so
    it is held to a hostname's letters and may not reach outside the directory.
    """
    if not name:
        return "a certificate name must not be empty; use the holder's hostname, for example node05"
    if len(name) > MAX_NAME:
        return (
            f"{name[:20]!r}... is {len(name)} characters; "
            f"a certificate name is at most {MAX_NAME}"
        )
    if not _NAME.fullmatch(name) or ".." in name:
        return (
            f"{name!r} is not a usable certificate name: use letters, digits, '.', '_' and '-', "
            "starting and ending with a letter or digit, without '..' "
            "(it becomes a file name and the WAMP authid)"
        )
    if name.lower() == "ca":
        return f"{name!r} is the CA's own file name (ca.crt, ca.key); choose another name"
    return None


def node_name_problem(name: str) -> str | None:
    """Why `name` cannot be a node's name, or None when it can: a certificate's name the link takes as a node id.

    A node's name is its short host name (``hostname -s``), never the fully
    qualified one: it is one component of the node's URIs.  :func:`llmgw.roles.is_node_id`
    is the link's own rule, so a node is never signed a certificate the hub then refuses.
    """
    if not isinstance(name, str):
        return f"a node's name is text, its short host name; not {type(name).__name__}"
    problem = name_problem(name)
    if problem is None and is_node_id(name):
        return None
    shown = repr(name) if len(name) <= MAX_NAME else f"{name[:20]!r}... ({len(name)} characters)"
    short = name.split(".")[0]
    if "." in name and name_problem(short) is None and is_node_id(short):
        instead = f"use {short!r}, its short host name"
    elif problem is not None:
        return problem
    else:
        instead = "use the node's short host name (what `hostname -s` prints), for example node05"
    return (
        f"{shown} is not a single DNS label, and a node's name is its short host name, one DNS label "
        f"(letters, digits, '-' and '_', starting and ending with a letter or digit, at most {MAX_LABEL} "
        f"characters, no dots), because it becomes one part of URIs like llmgw.node.NAME.ping: {instead}"
    )


def check_name(name: str) -> str:
    """Return `name` if it can name a certificate; raise PKIError saying why not."""
    problem = name_problem(name)
    if problem is not None:
        raise PKIError(problem)
    return name


def identity_of(cert: x509.Certificate) -> CertificateSubject:
    """The identity a certificate proves: name from its CN, role from its OU.

    This reads, it does not verify: the TLS handshake has already checked that
    the cluster CA signed `cert`.
    """
    name = _only_attribute(cert, NameOID.COMMON_NAME, "CN")
    role = _only_attribute(cert, NameOID.ORGANIZATIONAL_UNIT_NAME, "OU")
    if role not in CERT_ROLES:
        raise PKIError(
            f"certificate {_describe(cert)} has role OU={role!r}, which is none of "
            f"{', '.join(CERT_ROLES)}; issue it again with `llmgw pki issue --role ROLE`"
        )
    problem = name_problem(name)
    if problem is not None:
        raise PKIError(f"certificate {_describe(cert)}: {problem}")
    return CertificateSubject(name=name, role=role, serial=cert.serial_number, not_after=cert.not_valid_after_utc)


def _describe(cert: x509.Certificate) -> str:
    return f"'{describe_subject(cert)}' (serial {cert.serial_number:x})"


def _only_attribute(cert: x509.Certificate, oid: x509.ObjectIdentifier, label: str) -> str:
    values = cert.subject.get_attributes_for_oid(oid)
    if not values:
        raise PKIError(
            f"certificate {_describe(cert)} has no {label}; "
            "issue one with `llmgw pki issue`, which sets CN to the name and OU to the role"
        )
    if len(values) > 1:
        raise PKIError(
            f"certificate {_describe(cert)} has {len(values)} {label}s; "
            "an identity needs exactly one. Issue one with `llmgw pki issue`"
        )
    value = values[0].value
    if not isinstance(value, str):
        raise PKIError(f"certificate {_describe(cert)} has a {label} that is not text")
    return value
