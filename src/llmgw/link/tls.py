"""TLS contexts for both ends of the link, from the cluster CA's files.

The hub requires a client certificate signed by the cluster CA; clients check
the hub's certificate against the same CA and the hub's name or address.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

from cryptography import x509
from OpenSSL import SSL
from service_identity import VerificationError
from service_identity.hazmat import DNS_ID, IPAddress_ID, verify_service_identity
from service_identity.pyopenssl import extract_patterns
from twisted.internet import ssl
from twisted.internet.interfaces import IOpenSSLClientConnectionCreator
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from llmgw.errors import PKIError
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
    except Exception as e:
        raise PKIError(
            f"{files.cert} and {files.key} do not load as a certificate and its key: {e}"
        ) from None


def _ca(files: TLSFiles) -> ssl.Certificate:
    try:
        return ssl.Certificate.loadPEM(_read(files.ca, "CA certificate"))
    except PKIError:
        raise
    except Exception as e:
        raise PKIError(f"{files.ca} is not a PEM certificate: {e}") from None


def server_options(files: TLSFiles) -> ssl.CertificateOptions:
    """Options for the hub's listener: present our certificate, require theirs."""
    mine = _private_certificate(files)
    return ssl.CertificateOptions(
        privateKey=mine.privateKey.original,
        certificate=mine.original,
        verify=True,
        caCerts=[_ca(files).original],
        requireCertificate=True,
        raiseMinimumTo=ssl.TLSVersion.TLSv1_2,
    )


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
    return list(dict.fromkeys(names))


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
    cert = x509.load_pem_x509_certificate(_read(path, "certificate"))
    names = cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
    return str(names[0].value) if names else None
