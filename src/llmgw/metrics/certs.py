"""When this server's certificates expire, read at scrape time.

`llmgw_certificate_expiry_timestamp_seconds{certificate=...}` is the Unix time of
each certificate's `notAfter`: the cluster CA and the agent listener's
certificate when the cluster PKI is on, and the files of `api_tls` and
`agent_tls` (read again at every scrape, so a renewed file shows at once).

Not guaranteed: a series for a certificate file that cannot be read or parsed
at scrape time (it is left out and logged; the alert on a missing series is the
operator's).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from pathlib import Path

from cryptography import x509
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger("llmgw.metrics.certs")

CertificateSource = Callable[[], Iterable[tuple[str, datetime]]]


def certificate_file(name: str, path: str) -> CertificateSource:
    """The first certificate in PEM file `path`, named `name`; nothing when unreadable."""

    def read() -> list[tuple[str, datetime]]:
        try:
            cert = x509.load_pem_x509_certificate(Path(path).expanduser().read_bytes())
        except (OSError, ValueError) as exc:
            log.warning(
                "cannot read certificate %s (%s) for its expiry metric: %s", name, path, exc
            )
            return []
        return [(name, cert.not_valid_after_utc)]

    return read


class CertificateMetrics(Collector):
    """Registers itself on `registry`; reads every source at each scrape."""

    def __init__(
        self, *, registry: CollectorRegistry, sources: Iterable[CertificateSource]
    ) -> None:
        self._sources = list(sources)
        registry.register(self)

    def describe(self) -> Iterator[Metric]:
        yield self._family()

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for source in self._sources:
            for name, not_after in source():
                family.add_metric([name], not_after.timestamp())
        yield family

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "llmgw_certificate_expiry_timestamp_seconds",
            "Unix time at which each of this server's certificates expires (notAfter).",
            labels=["certificate"],
        )
