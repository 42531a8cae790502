"""The hub's figures on the server's admin listener: what each link limit refused, the listeners' budgets, and
when the server's own certificates expire."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator, Mapping

from cryptography import x509
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

# Every limit Hub.refusals and HubTLS.refusals count, so each series exists (at 0) before its first
# refusal: llmgw's names, never a peer's text.  The certificate_* and the HELLO's own (no_such_realm,
# authid_mismatch) are sessions refused at HELLO, after a handshake that completed; the tls_* (and a
# revoked certificate OpenSSL could not judge) connections refused by a TLS alert.
LIMITS = ("hello_timeout", "duplicate_node", "subscriptions", "message_depth", "invalid_uri",
          "not_authorized", "protocol_violation",
          "certificate_expired", "certificate_not_yet_valid", "certificate_revoked", "certificate_purpose",
          "certificate_subject", "no_certificate", "no_such_realm", "authid_mismatch",
          "tls_certificate", "tls_no_certificate", "tls_handshake")
# A certificate chain file is a few kB; one far larger is not one.
MAX_CERTIFICATE_BYTES = 1 << 20


class LinkCollector(Collector):
    """Reads the hub's counters, its TLS's (*tls*, a ``HubTLS``) and each listener's ``ConnectionBudget`` on every collect."""

    def __init__(self, hub, listeners: Mapping[str, object], tls=None):
        self._hub = hub
        self._listeners = listeners
        self._tls = tls

    def collect(self) -> Iterator[Metric]:
        refusals = CounterMetricFamily(
            "llmgw_link_refusals", "Messages, sessions and connections the hub refused or ended, by link limit",
            labels=["limit"],
        )
        counted = self._hub.refusals + (self._tls.refusals if self._tls is not None else Counter())
        for limit in sorted(set(LIMITS) | set(counted)):
            refusals.add_metric([limit], counted.get(limit, 0))
        yield refusals
        duplicates = CounterMetricFamily(
            "llmgw_link_duplicate_sessions_refused",
            "Second sessions refused for a node whose first session answered (two agents with one certificate)",
            labels=["node"],
        )
        for node, record in sorted(self._hub.duplicates.items()):
            duplicates.add_metric([node], record.count)
        yield duplicates
        held = GaugeMetricFamily("llmgw_listener_connections", "Connections a listener holds now", labels=["listener"])
        limit = GaugeMetricFamily("llmgw_listener_connection_limit", "The most connections a listener holds",
                                  labels=["listener"])
        refused = CounterMetricFamily("llmgw_listener_connections_refused",
                                      "Connections closed as they arrived because the listener was full",
                                      labels=["listener"])
        for name, budget in sorted(self._listeners.items()):
            held.add_metric([name], budget.held)
            limit.add_metric([name], budget.limit)
            refused.add_metric([name], budget.refused)
        yield from (held, limit, refused)


class CertificateCollector(Collector):
    """When the server's own certificates expire, read from their files at each scrape.

    ``paths`` names each certificate (``server``, ``ca``) and its PEM file.
    The file is parsed again only when its inode, size or modification time
    changes, so a certificate renewed in place (or renamed over it, as
    ``llmgw pki issue --force`` does) is seen at the next scrape, even one
    renewed within the file system's clock tick of the last.
    A file that cannot be read or parsed leaves its series out: absent, and
    the log of the next reload says why.
    """

    def __init__(self, paths: Mapping[str, str | os.PathLike]):
        self._paths = dict(paths)
        self._seen: dict[str, tuple[tuple[int, int, int], float]] = {}

    def describe(self) -> Iterator[Metric]:
        return iter([self._family()])

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily("llmgw_certificate_expiry_timestamp_seconds",
                                 "When the server's own certificate expires (Unix time), by certificate (server, ca).",
                                 labels=["certificate"])

    def _not_after(self, name: str, path) -> float | None:
        try:
            st = os.stat(path)
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
            seen = self._seen.get(name)
            if seen is not None and seen[0] == stamp:
                return seen[1]
            with open(path, "rb") as f:
                cert = x509.load_pem_x509_certificate(f.read(MAX_CERTIFICATE_BYTES))
        except (OSError, ValueError):
            self._seen.pop(name, None)
            return None
        not_after = cert.not_valid_after_utc.timestamp()
        self._seen[name] = (stamp, not_after)
        return not_after

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for name, path in sorted(self._paths.items()):
            not_after = self._not_after(name, path)
            if not_after is not None:
                family.add_metric([name], not_after)
        return iter([family] if family.samples else [])
