"""TLS contexts for both ends of the link, from the cluster CA's files.

The hub requires a client certificate signed by the cluster CA and not on
its revocation list (checked at every handshake, the list replaced on a
reload without a restart); clients check the hub's certificate against the
same CA and the hub's name or address.  Every refusal at the hub is one log
line naming the peer's address, the certificate's subject and why.
"""

from __future__ import annotations

import datetime
import ipaddress
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from OpenSSL import SSL, crypto
from service_identity import VerificationError
from service_identity.hazmat import DNS_ID, IPAddress_ID, verify_service_identity
from service_identity.pyopenssl import extract_patterns
from twisted.internet import ssl
from twisted.internet.interfaces import IOpenSSLClientConnectionCreator, IOpenSSLServerConnectionCreator
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from llmgw.errors import PKIError
from llmgw.pki.revocation import Revocation, RevocationList, read_revocations
from llmgw.pki.subject import describe_subject, printable
from llmgw.tlsfiles import TLSFiles

log = Logger()


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise PKIError(f"{path}: cannot read the {what}: {e.strerror}") from None


def _private_certificate(files: TLSFiles) -> ssl.PrivateCertificate:
    cert = _read(files.cert, "certificate")
    key = _read(files.key, "private key")
    try:
        return ssl.PrivateCertificate.loadPEM(cert + b"\n" + key)
    except Exception:
        raise PKIError(f"{files.cert} and {files.key} do not load as a certificate and its key: "
                       f"{_why_not_a_pair(files, cert, key)}") from None


def _why_not_a_pair(files: TLSFiles, cert: bytes, key: bytes) -> str:
    """Which of the two files is wrong, and how, in words (OpenSSL says "[('DECODER routines', '', 'unsupported')]")."""
    try:
        public = x509.load_pem_x509_certificate(cert).public_key()
    except ValueError:
        return f"{files.cert} is not a PEM certificate; {_ISSUE}"
    try:
        private = serialization.load_pem_private_key(key, None)
    except TypeError:
        return f"{files.key} is encrypted, and llmgw reads a key without a passphrase; {_ISSUE}"
    except (ValueError, UnsupportedAlgorithm):
        return f"{files.key} is not a PEM private key; {_ISSUE}"
    if private.public_key() != public:
        return f"{files.key} is not the key of {files.cert}; give the key issued with it"
    return "OpenSSL refuses the pair; issue them again"


_ISSUE = "write the certificate and its key with `llmgw pki issue`"


def _ca(files: TLSFiles) -> ssl.Certificate:
    try:
        return ssl.Certificate.loadPEM(_read(files.ca, "CA certificate"))
    except PKIError:
        raise
    except Exception:
        raise PKIError(f"{files.ca} is not a PEM certificate; it is the cluster CA's ca.crt, "
                       "from `llmgw pki init` or the server") from None


def server_options(files: TLSFiles) -> HubTLS:
    """The hub's listener TLS: present our certificate, require theirs, refuse a revoked one."""
    mine = _private_certificate(files)
    ca = _ca(files)

    def options() -> ssl.CertificateOptions:
        return ssl.CertificateOptions(
            privateKey=mine.privateKey.original,
            certificate=mine.original,
            verify=True,
            caCerts=[ca.original],
            requireCertificate=True,
            raiseMinimumTo=ssl.TLSVersion.TLSv1_2,
        )

    return HubTLS(options, load_revocations(files))


def load_revocations(files: TLSFiles) -> RevocationList:
    """The revocation list *files* name (``tls.crl``, or crl.pem beside the CA), checked against their CA.

    No list is an empty one.  PKIError when the file is not a list signed by
    the cluster CA, so a start or a reload refuses rather than trusting it.
    """
    path = files.revocation_list()
    if path is None:
        return RevocationList()
    return read_revocations(path, _ca(files).original.to_cryptography())


@attrs.frozen
class LivePeer:
    """A link connection whose certificate the hub accepted, as the hub's TLS knows it."""

    address: str
    subject: str  # printable RFC 4514 text
    serial: int
    not_after: datetime.datetime


@implementer(IOpenSSLServerConnectionCreator)
class HubTLS:
    """The hub's TLS connections: Twisted's options, with the revocation list checked at every handshake.

    ``revocations`` is read at each handshake, so :meth:`replace` takes effect
    on the next one; the connections already open are kept (weakly) with
    their certificate, so a reload can close those it has revoked.
    """

    def __init__(self, options: Callable[[], ssl.CertificateOptions], revocations: RevocationList):
        self._make_options = options
        self._live: weakref.WeakKeyDictionary[object, LivePeer] = weakref.WeakKeyDictionary()
        self.refusals: Counter[str] = Counter()  # connections refused by a TLS alert, by kind (metrics.LIMITS)
        self._use(revocations)

    def _use(self, revocations: RevocationList) -> None:
        # A new context for each list: OpenSSL's store can add a list but not
        # take one back, and connections already open keep the context they had.
        options = self._make_options()
        if revocations.crl is not None:
            store = options.getContext().get_cert_store()
            store.add_crl(revocations.crl)
            store.set_flags(crypto.X509StoreFlags.CRL_CHECK)
        self._options, self.revocations = options, revocations

    def serverConnectionForTLS(self, tlsProtocol):
        connection = self._options.serverConnectionForTLS(tlsProtocol)
        handshake = _Handshake(self, tlsProtocol)
        connection.set_verify(SSL.VERIFY_PEER | SSL.VERIFY_FAIL_IF_NO_PEER_CERT, handshake.verify)
        connection.set_info_callback(handshake.info)
        return connection

    def live(self) -> list[LivePeer]:
        """The connections open now whose certificates the hub accepted, with their expiry."""
        return [peer for _, peer in self._open()]

    def revoked_peers(self) -> list[tuple[LivePeer, Revocation]]:
        """The open connections whose certificates the current list revokes."""
        return [(peer, r) for _, peer, r in self._revoked()]

    def replace(self, revocations: RevocationList) -> list[str]:
        """Check handshakes against *revocations* from now on and close the open connections it revokes.

        Returns one sentence per connection closed (each also logged).
        """
        self._use(revocations)
        closed = []
        for protocol, peer, revocation in list(self._revoked()):
            sentence = (
                f"closed the link connection of {peer.subject} from {peer.address}: its certificate was "
                f"{revocation.reason}"
            )
            log.warn("{sentence}", sentence=sentence)
            closed.append(sentence)
            try:
                # abort, not a TLS close: a peer that ignores close_notify would keep its session.
                protocol.abortConnection()
            except Exception:
                log.failure("while closing the link connection of {subject}", subject=peer.subject)
        return closed

    def _open(self) -> Iterator[tuple[object, LivePeer]]:
        for protocol, peer in list(self._live.items()):
            if getattr(protocol, "connected", False) and not getattr(protocol, "disconnecting", False):
                yield protocol, peer

    def _revoked(self) -> Iterator[tuple[object, LivePeer, Revocation]]:
        for protocol, peer in self._open():
            revocation = self.revocations.revoked(peer.serial)
            if revocation is not None:
                yield protocol, peer, revocation

    def _accepted(self, tlsProtocol, peer: LivePeer) -> None:
        self._live[tlsProtocol] = peer


class LinkRefused(Exception):
    """The hub refused a link connection at the handshake; the message is the log's sentence."""


X509_V_ERR_CERT_NOT_YET_VALID = 9
X509_V_ERR_CERT_HAS_EXPIRED = 10
X509_V_ERR_CERT_REVOKED = 23
X509_V_ERR_INVALID_PURPOSE = 26

# A certificate the cluster CA signed that is refused only for when it is
# valid, its purpose, or because it was revoked: the handshake completes (the peer proves
# it holds the key), the hub opens no session for it, and its HELLO is
# answered with ABORT and the reason with what to do.  A TLS alert would
# tell it only "certificate expired", and under TLS 1.3 not even that at
# once: a client's certificate is judged after the client thinks the
# handshake is done.  What is not from the cluster CA is still refused by
# an alert: it gets no words from the hub.
_REISSUE = "issue a new certificate with `llmgw pki issue DIR NAME --role ROLE --force` where the CA is"
_TOLD_IN_ABORT = {
    X509_V_ERR_CERT_NOT_YET_VALID: "check the clocks of this machine and the server",
    X509_V_ERR_CERT_HAS_EXPIRED: _REISSUE,
    X509_V_ERR_CERT_REVOKED: _REISSUE,
    X509_V_ERR_INVALID_PURPOSE: _REISSUE,
}
# Each one's kind: the label it is counted by in llmgw_link_refusals_total.
_KINDS = {
    X509_V_ERR_CERT_NOT_YET_VALID: "certificate_not_yet_valid",
    X509_V_ERR_CERT_HAS_EXPIRED: "certificate_expired",
    X509_V_ERR_CERT_REVOKED: "certificate_revoked",
    X509_V_ERR_INVALID_PURPOSE: "certificate_purpose",
}


@attrs.frozen
class SessionRefusal:
    """Why a peer gets no session: *sentence* answers its HELLO in an ABORT; *kind*, one of llmgw's, counts it."""

    kind: str
    sentence: str


_refused_sessions: weakref.WeakKeyDictionary[object, SessionRefusal] = weakref.WeakKeyDictionary()


def refused_session(tlsProtocol) -> SessionRefusal | None:
    """Why the hub opens no session on *tlsProtocol*, whose handshake it completed only to say so; None if it may."""
    try:
        return _refused_sessions.get(tlsProtocol)
    except TypeError:
        return None  # not weakly referable: not one of the hub's TLS connections

# OpenSSL's X509_V_ERR_* codes a client certificate fails with, in words.
_VERIFY_ERRORS = {
    2: "its issuer's certificate is not the cluster CA's",
    3: "the hub has no revocation list for its CA",
    7: "its signature does not verify",
    8: "the revocation list's signature does not verify",
    9: "it is not valid yet (check the clocks)",
    10: "it has expired",
    11: "the hub's revocation list is not valid yet: check this server's clock",
    12: "the hub's revocation list has expired with the CA; create a new CA",
    18: "it is self-signed, not issued by the cluster CA",
    19: "its chain ends in a CA that is not the cluster's",
    20: "it was not issued by the cluster CA",
    21: "it was not issued by the cluster CA",
    24: "it was issued by a certificate that is not a CA",
    26: "it is not for TLS client use",
    32: "its key may not sign",
}

# TLS alert descriptions (RFC 8446 section 6), for handshakes that fail before a certificate is judged.
_ALERTS = {
    40: "handshake failure", 42: "bad certificate", 43: "unsupported certificate", 44: "certificate revoked",
    45: "certificate expired", 46: "certificate unknown", 47: "illegal parameter", 48: "unknown CA",
    50: "decode error", 51: "decrypt error", 70: "protocol version", 71: "insufficient security",
    80: "internal error", 86: "inappropriate fallback", 109: "missing extension", 112: "unrecognized name",
    116: "certificate required", 120: "no application protocol",
}
_FATAL = 2


class _Handshake:
    """One connection's handshake as the hub judges it: the leaf certificate, and the one refusal logged."""

    def __init__(self, hub: HubTLS, tlsProtocol):
        self._hub = hub
        # Weak: the connection refers to this object through its callbacks.
        self._protocol = weakref.ref(tlsProtocol)
        self._refused = False
        self._established = False
        self._told: tuple[str, int] | None = None  # (why, OpenSSL's error): refused in the ABORT, not by an alert

    def _address(self) -> str:
        protocol = self._protocol()
        transport = getattr(protocol, "transport", None)
        peer = transport.getPeer() if transport is not None else None
        host, port = getattr(peer, "host", None), getattr(peer, "port", None)
        if host is None:
            return printable(str(peer)) if peer is not None else "an unknown address"
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def _refuse(self, why: str, kind: str | None) -> None:
        """Log *why* once; refused by an alert when *kind* (its count's label) is given, else told at HELLO."""
        if self._refused:
            return
        self._refused = True
        alert = kind is not None
        if alert:
            self._hub.refusals[kind] += 1
        sentence = f"refused the link connection from {self._address()}: {why}"
        log.warn("{sentence}", sentence=sentence)
        protocol = self._protocol()
        if protocol is not None and getattr(protocol, "_reason", True) is None and alert:
            # What the connection ends with, in place of OpenSSL's "certificate verify failed (in )"
            # that the WebSocket layer would log again.  Set, not failVerification(): aborting here
            # would stop the TLS alert from reaching the peer.
            protocol._reason = Failure(LinkRefused(sentence))

    def verify(self, conn, cert, errno: int, depth: int, ok: int) -> bool:
        try:
            leaf = cert.to_cryptography()
            subject = describe_subject(leaf)
            revocation = self._hub.revocations.revoked(leaf.serial_number) if depth == 0 else None
            if not ok:
                reason = _VERIFY_ERRORS.get(errno, f"OpenSSL verify error {errno}")
                if errno == X509_V_ERR_CERT_HAS_EXPIRED:
                    reason += f" (on {leaf.not_valid_after_utc:%Y-%m-%d})"
                elif errno == X509_V_ERR_CERT_NOT_YET_VALID:
                    reason = f"it is not valid until {leaf.not_valid_before_utc:%Y-%m-%d %H:%M} UTC"
                elif errno == X509_V_ERR_CERT_REVOKED:
                    reason = revocation.reason if revocation is not None else f"revoked (serial {leaf.serial_number:x})"
                if depth == 0 and errno in _TOLD_IN_ABORT:
                    # Judged again with every other check OpenSSL makes; any other failure is an alert.
                    self._told = self._told or (f"certificate {subject}: {reason}", errno)
                    return True
                where = "" if depth == 0 else f" (its chain, at depth {depth})"
                self._refuse(f"certificate {subject}{where}: {reason}", "tls_certificate")
                return False
            if depth != 0 or self._told is not None:
                return True
            if revocation is not None:
                # OpenSSL checks the list too; this is for a list it could not apply.
                self._refuse(f"certificate {subject}: {revocation.reason}", "certificate_revoked")
                return False
            protocol = self._protocol()
            if protocol is not None:
                self._hub._accepted(protocol, LivePeer(self._address(), subject, leaf.serial_number,
                                                       leaf.not_valid_after_utc))
            return True
        except Exception:
            log.failure("while checking a client certificate from {peer}", peer=self._address())
            return False

    def info(self, conn, where: int, ret: int) -> None:
        if where & SSL.SSL_CB_HANDSHAKE_DONE:
            self._established = True
            protocol = self._protocol()
            if self._told is not None and not self._refused and protocol is not None:
                why, errno = self._told
                self._refuse(why, None)  # counted when its HELLO is answered
                _refused_sessions[protocol] = SessionRefusal(_KINDS[errno], f"{why}; {_TOLD_IN_ABORT[errno]}")
            return
        if not where & SSL.SSL_CB_ALERT or ret >> 8 != _FATAL or self._refused:
            return
        if self._established:
            # After the handshake: a link ending badly (its peer killed mid-record, say),
            # not a connection the hub refused; its session's end is logged by the hub.
            log.debug("link connection from {peer} ended with a TLS alert ({n})", peer=self._address(), n=ret & 0xFF)
            return
        if conn.client_random() is None:
            # No ClientHello came: a TCP probe (a health check, the port
            # scanned), not a TLS client the hub refused.
            return
        try:
            alert = _ALERTS.get(ret & 0xFF, f"TLS alert {ret & 0xFF}")
            kind = "tls_handshake"
            if where & SSL.SSL_CB_WRITE:
                if ret & 0xFF == 116 or (ret & 0xFF == 40 and conn.get_peer_certificate() is None):
                    kind = "tls_no_certificate"
                    why = ("it sent no client certificate; a node, an operator and a router each need one "
                           "from `llmgw pki issue`")
                else:
                    why = f"the hub ended the handshake ({alert})"
            else:
                why = f"the peer ended the handshake ({alert})"
                if ret & 0xFF in (42, 45, 46, 48):
                    why += ": it does not accept the hub's certificate; check that its ca.crt is this cluster's"
            self._refuse(why, kind)
        except Exception:
            log.failure("while logging a refused link connection")


def client_options(files: TLSFiles, hub_host: str):
    """Options for dialling the hub: check it against the CA and its name.

    A hub whose certificate does not name *hub_host* fails the connection with
    ``HubNameMismatch``, which says which names it has and how to add this one.
    """
    return _NamingHub(ssl.optionsForClientTLS(
        hub_host,
        trustRoot=_ca(files),
        clientCertificate=_private_certificate(files),
    ), hub_host)


class HubNameMismatch(Exception):
    """The hub's certificate does not name the address it was dialled at."""

    def __init__(self, host: str, names: list[str]):
        super().__init__(host, names)
        self.host = host
        self.names = names

    def __str__(self) -> str:
        holder = self.names[0] if self.names else "NAME"
        sans = "".join(f" --san {n}" for n in [*self.names[1:], self.host])
        return (
            f"the hub's certificate is for {', '.join(self.names) or 'no name'}, not {self.host}: "
            f"re-issue it with llmgw pki issue DIR --role server {holder}{sans} --force "
            f"and restart the server"
        )


def certificate_names(cert: x509.Certificate) -> list[str]:
    """The CN, then each DNS name and IP address of *cert*, each once."""
    names = [str(a.value) for a in cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)]
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        sans = []
    for general in sans:
        if isinstance(general, (x509.DNSName, x509.IPAddress)):
            names.append(str(general.value))
    return list(dict.fromkeys(printable(name) for name in names))


@implementer(IOpenSSLClientConnectionCreator)
class _NamingHub:
    """Twisted's client TLS, with the hub's identity checked here so a mismatch can name both sides.

    Twisted's own check fails with ``VerificationError(errors=[IPAddressMismatch(...)])``,
    which names only the address dialled; the certificate's names are gone by then.
    """

    def __init__(self, inner, host: str):
        self._inner = inner
        self._host = host
        try:
            self._wanted = IPAddress_ID(str(ipaddress.ip_address(host)))
        except ValueError:
            self._wanted = DNS_ID(host)

    def clientConnectionForTLS(self, tlsProtocol):
        connection = self._inner.clientConnectionForTLS(tlsProtocol)
        protocol = [tlsProtocol]  # dropped after the leaf certificate, as Twisted does: no cycle

        def verify(conn, cert, err, depth, ok):
            if depth != 0 or not ok or not protocol:
                return ok  # the chain is OpenSSL's to judge; only the leaf names the hub
            holder = protocol.pop()
            try:
                verify_service_identity(extract_patterns(cert), [self._wanted], [])
            except VerificationError:
                holder.failVerification(Failure(HubNameMismatch(self._host, certificate_names(cert.to_cryptography()))))
                return False
            except BaseException:
                log.failure("while checking the hub's certificate")
                return False
            return True

        connection.set_verify(SSL.VERIFY_PEER | SSL.VERIFY_FAIL_IF_NO_PEER_CERT, verify)
        return connection


def certificate_common_name(path: str) -> str | None:
    """The CN of the certificate in *path*, to check an agent's id before dialling."""
    try:
        cert = x509.load_pem_x509_certificate(_read(path, "certificate"))
    except ValueError:
        raise PKIError(f"{path} is not a PEM certificate; {_ISSUE}") from None
    names = cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
    return str(names[0].value) if names else None
