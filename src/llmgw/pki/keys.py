"""Which keys the cluster CA signs: those the link's TLS accepts, and no other.

A certificate for a key the TLS here refuses (RSA under 2048 bits, a curve
TLS 1.3 does not name) would be written, copied to its holder, and then fail
at every handshake with an alert that does not say why.  :func:`key_problem`
is the one rule, read before anything is signed: the CA's own key when it is
loaded, and every request's key.
"""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, rsa
from cryptography.hazmat.primitives.asymmetric.types import CertificatePublicKeyTypes

# OpenSSL's default security level (2) refuses RSA under 2048 bits; it will not
# verify a signature by one over 16384.
MIN_RSA_BITS = 2048
MAX_RSA_BITS = 16384
# The curves TLS 1.3 signs with (RFC 8446 section 4.2.3), which both ends of the
# link offer.
CURVES = {"secp256r1": "P-256", "secp384r1": "P-384", "secp521r1": "P-521"}

ACCEPTED = (
    f"an EC key on {', '.join(CURVES.values())}, RSA of {MIN_RSA_BITS} to {MAX_RSA_BITS} bits, "
    "Ed25519 or Ed448"
)


def describe_key(key: CertificatePublicKeyTypes) -> str:
    """``RSA-1024``, ``EC P-256``, ``EC secp192r1``, ``Ed25519``: what a key is, in one word or two."""
    if isinstance(key, rsa.RSAPublicKey):
        return f"RSA-{key.key_size}"
    if isinstance(key, ec.EllipticCurvePublicKey):
        return f"EC {CURVES.get(key.curve.name, key.curve.name)}"
    if isinstance(key, ed25519.Ed25519PublicKey):
        return "Ed25519"
    if isinstance(key, ed448.Ed448PublicKey):
        return "Ed448"
    if isinstance(key, dsa.DSAPublicKey):
        return f"DSA-{key.key_size}"
    return type(key).__name__.removeprefix("_").removesuffix("PublicKey") or "unknown"


def key_problem(key: CertificatePublicKeyTypes) -> str | None:
    """Why the link's TLS would refuse a certificate for *key*, or None when it accepts one."""
    if isinstance(key, rsa.RSAPublicKey):
        if MIN_RSA_BITS <= key.key_size <= MAX_RSA_BITS:
            return None
    elif isinstance(key, ec.EllipticCurvePublicKey):
        if key.curve.name in CURVES:
            return None
    elif isinstance(key, (ed25519.Ed25519PublicKey, ed448.Ed448PublicKey)):
        return None
    return f"{describe_key(key)}, which the link's TLS refuses (it takes {ACCEPTED})"
