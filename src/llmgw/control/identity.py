"""The control plane's CA, for operators onboarding nodes: sign a node's request, revoke its certificate.

``llmgw ctl onboard`` has the node make its key and a request and sends only
the request here; ``ctl offboard`` revokes what was signed.  Both are for
operators only, whatever the link's rules allow, and each is logged with the
operator's name.  The CA is server.yaml's ``pki.ca_dir``; without one the
server signs nothing and says where to sign instead.  ``ca.key`` is read
there and nothing of it is ever answered.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import RegisterOptions
from cryptography import x509
from twisted.logger import Logger

from llmgw import __version__
from llmgw.answers import Onboarding, RevocableNode, RevokedNode, SignableNode, SignedNode
from llmgw.durable import write_file
from llmgw.errors import PKIError
from llmgw.link import uris
from llmgw.pki import CA_CERT, CRL_FILE, read_revocations
from llmgw.pki.nodes import node_name_free, node_to_revoke, revoke_node, sign_node
from llmgw.pki.subject import node_name_problem
from llmgw.pki.authority import MAX_REQUEST_BYTES
from llmgw.roles import ROLE_OPERATOR
from llmgw.tlsfiles import CRL_BESIDE_CA
from llmgw.wire import to_wire

log = Logger()


class Identity:
    """Signs and revokes node certificates with the CA in ``ca_dir()`` (None: this server keeps no CA).

    *revocations_changed* has the hub read its revocation list again (and
    close what it now revokes); it returns the sentence saying what changed.
    *hub_list* is the list the hub reads (``tls.crl``, or crl.pem beside the
    CA when there is one), where revoking copies the CA's list when that is
    another file; *ca_file* the CA certificate the hub trusts (tls.ca);
    *forget* has the fleet forget a node once its certificate is revoked.
    """

    def __init__(self, ca_dir: Callable[[], str | None], revocations_changed: Callable[[], str | None],
                 hub_list: Callable[[], str | None], ca_file: Callable[[], str],
                 forget: Callable[[str], object] = lambda node_id: None):
        self._forget = forget
        self._ca_file = ca_file
        self._ca_dir = ca_dir
        self._revocations_changed = revocations_changed
        self._hub_list = hub_list

    async def register(self, session) -> None:
        with_details = RegisterOptions(details_arg="details")
        await session.register(self.onboarding, uris.CP_ONBOARDING, with_details)
        await session.register(self.sign_node, uris.CP_SIGN_NODE, with_details)
        await session.register(self.revoke_node, uris.CP_REVOKE_NODE, with_details)

    def onboarding(self, details=None) -> dict:
        """What a node onboarded now is to have: this server's llmgw version, the CA it trusts, whether it signs."""
        _operator(details)
        return to_wire(Onboarding(__version__, self._ca_dir() is not None, Path(self._ca_file()).read_text()))

    def sign_node(self, node_id, request=None, replace=False, check=False, details=None) -> dict:
        """Sign *request* (PEM text) for node *node_id*; the answer is the certificate and the CA's, as PEM.

        By :func:`llmgw.pki.nodes.sign_node`'s rule: the same key renews; another
        key is refused unless *replace*, which revokes the old certificate first
        (and puts the list where the hub reads it), or unless that certificate
        is revoked already (an offboarded node onboarded again).  With *check*,
        nothing is signed: onboarding asks whether the name may be a node's at
        all (:func:`llmgw.pki.nodes.node_name_free`) before it changes the node,
        and the answer is a ``SignableNode`` (with the serial NODE.crt holds, or None); else a ``SignedNode``.
        """
        operator = _operator(details)
        node_id = _node_id(node_id)
        directory = self._directory(f"sign {node_id}'s request there with "
                                    f"`llmgw pki sign DIR CSR --role node --name {node_id}`")
        if check:
            try:
                if replace:
                    _check_hub_list(directory, self._hub_file())
                held = node_name_free(directory, node_id)
            except PKIError as e:
                raise ApplicationError(uris.ERROR_REFUSED, str(e)) from None
            return to_wire(SignableNode(node_id, None if held is None else f"{held.serial_number:x}"))
        if not isinstance(request, str) or len(request) > MAX_REQUEST_BYTES:
            raise ApplicationError(uris.ERROR_INVALID_ARGUMENT, f"a certificate request is PEM text of at most {MAX_REQUEST_BYTES} bytes")
        try:
            hub = self._hub_file()
            if replace:
                _check_hub_list(directory, hub)
            signed = sign_node(directory, node_id, request.encode(), bool(replace))
            if signed.replaced is not None:
                log.info("{operator} replaced node {node}: revoked serial {serial:x}",
                         operator=operator, node=node_id, serial=signed.replaced.revocation.serial)
                _copy_to_hub(signed.replaced.path, hub)
                self._revocations_changed()
        except PKIError as e:
            raise ApplicationError(uris.ERROR_REFUSED, str(e)) from None
        cert = signed.certificate
        log.info("{operator} had node {node}'s certificate signed (serial {serial:x}, valid until {until})",
                 operator=operator, node=node_id, serial=cert.serial_number, until=f"{cert.not_valid_after_utc:%Y-%m-%d}")
        return to_wire(SignedNode(certificate=signed.path.read_text(), ca=(directory / CA_CERT).read_text(),
                                  serial=f"{cert.serial_number:x}", not_after=cert.not_valid_after_utc.isoformat()))

    def revoke_node(self, node_id, check=False, details=None) -> dict:
        """Revoke NODE.crt in the CA's directory, put the list where the hub reads it, and have the hub read it again.

    The hub reads ``tls.crl``, else ``crl.pem`` beside ``tls.ca``; when that
    is not ``pki.ca_dir``'s own list, the CA's list is copied there (refused
    when the hub's list revokes serials the CA's does not).  A list that
    cannot be written there refuses: the node would otherwise rejoin.  With
    *check*, nothing is revoked: ``ctl offboard`` asks whether it would be,
    before it drains or removes anything, and the answer is a ``RevocableNode``; else a ``RevokedNode``.
    """
        operator = _operator(details)
        node_id = _node_id(node_id)
        directory = self._directory(f"revoke it there with `llmgw pki revoke DIR {node_id}`")
        try:
            hub = self._hub_file()
            _check_hub_list(directory, hub)
            if check:
                return to_wire(RevocableNode(node_id, f"{node_to_revoke(directory, node_id).serial_number:x}"))
            done = revoke_node(directory, node_id)
            _copy_to_hub(done.path, hub)
            said = self._revocations_changed()
        except PKIError as e:
            raise ApplicationError(uris.ERROR_REFUSED, str(e)) from None
        log.info("{operator} revoked node {node}'s certificate (serial {serial:x})",
                 operator=operator, node=node_id, serial=done.revocation.serial)
        self._forget(node_id)
        return to_wire(RevokedNode(node_id, f"{done.revocation.serial:x}", done.already, said))

    def _hub_file(self) -> Path:
        """The revocation list the hub reads: tls.crl, else crl.pem beside tls.ca (written there when not yet)."""
        return Path(self._hub_list() or Path(self._ca_file()).with_name(CRL_BESIDE_CA))

    def _directory(self, elsewhere: str) -> Path:
        ca_dir = self._ca_dir()
        if ca_dir is None:
            raise ApplicationError(uris.ERROR_REFUSED, (
                f"this server keeps no CA (pki.ca_dir is not set in server.yaml); {elsewhere} "
                f"where ca.key is, or set pki.ca_dir to that directory"))
        return Path(ca_dir)


def _check_hub_list(directory: Path, hub: Path) -> None:
    """Refuse, before revoking, when the hub's list revokes serials the CA's own list does not (copying would drop them)."""
    ours = directory / CRL_FILE
    if not os.path.lexists(hub) or _same_file(hub, ours):
        return
    ca = x509.load_pem_x509_certificate((directory / CA_CERT).read_bytes())
    theirs = read_revocations(hub, ca)
    mine = read_revocations(ours, ca) if os.path.lexists(ours) else None
    missing = set(theirs.entries) - set(mine.entries if mine else ())
    if missing:
        raise PKIError(
            f"the hub's revocation list {hub} revokes {len(missing)} certificate(s) the CA's list {ours} does not "
            f"(serials {', '.join(f'{s:x}' for s in sorted(missing)[:5])}); the control plane writes its list there "
            f"and would let them back in: revoke them in pki.ca_dir too (`llmgw pki revoke {directory} --serial HEX`), "
            f"or point tls.crl at {ours}")


def _copy_to_hub(written: Path, hub: Path) -> None:
    """Put the CA's list where the hub reads it (tls.crl, else crl.pem beside tls.ca), when that is another file."""
    if _same_file(written, hub):
        return
    try:
        write_file(hub, written.read_bytes(), private=False, replace=True)
    except OSError as e:
        raise PKIError(f"revoked in {written}, but cannot write the hub's revocation list {hub} ({e.strerror}), so the "
                       f"hub still accepts the certificate: let the server write there, or set tls.crl to {written}, "
                       "then run `llmgw ctl offboard` again") from None


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


def _operator(details) -> str:
    if details is None or details.caller_authrole != ROLE_OPERATOR:
        who = getattr(details, "caller_authid", None)
        raise ApplicationError(uris.ERROR_NOT_AUTHORIZED, f"{who} is not an operator; only operators onboard nodes")
    return details.caller_authid


def _node_id(node_id) -> str:
    problem = node_name_problem(node_id)
    if problem is not None:
        raise ApplicationError(uris.ERROR_INVALID_ARGUMENT, f"node id {problem}")
    return node_id
