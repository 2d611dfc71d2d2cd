"""The TLS rows of ``benchmarks.publish``: the ``nofsync`` 1 KiB produce and consume again with TLS on each side's
client port, against JetStream with TLS and against tidelog in clear in the same run.

Both sides get a certificate from one throwaway CA (:mod:`tidelog.local.certificates`) on the port their clients
use (tidelog's wire port, NATS's client port), verified by the client; neither asks for client certificates.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping, Sequence
from typing import Any

from benchmarks._common import Row, log, median
from tidelog.local.certificates import DevCertificates
from tidelog.protocol.tls import TlsFiles, client_context

__all__ = ["TLS_APPROACH", "TLS_LABEL", "TLS_METRICS", "client_ssl", "measure_tls", "tls_rows"]

TLS_LABEL = "1k"  # the TLS rows measure 1 KiB messages only
TLS_METRICS = ((f"produce_{TLS_LABEL}_tls", "msg/s"), (f"consume_{TLS_LABEL}_tls", "msg/s"))
TLS_APPROACH = (
    "both sides: a certificate from a throwaway CA on the client port (tidelog's wire port, NATS's client port), "
    "verified by the client; no client certificates"
)


def client_ssl(certificates: DevCertificates | None) -> ssl.SSLContext | None:
    """A client context trusting the throwaway CA, or None (plaintext)."""
    return client_context(TlsFiles(ca=certificates.ca)) if certificates is not None else None


async def measure_tls(
    side: Any, payloads: Sequence[bytes], size: int, samples: dict[tuple[str, str], list[float]]
) -> None:
    """Produce ``payloads`` to a new stream and read them back, on a side whose client port speaks TLS."""
    stream, count = f"produce_{TLS_LABEL}_tls", len(payloads)
    rate = await side.produce(stream, payloads)
    samples[side.name, f"produce_{TLS_LABEL}_tls"].append(rate)
    log(f"  {side.name} produce_{TLS_LABEL}_tls: {rate:,.0f} msg/s ({count} messages)")
    rate = await side.consume(stream, count, size)
    samples[side.name, f"consume_{TLS_LABEL}_tls"].append(rate)
    log(f"  {side.name} consume_{TLS_LABEL}_tls: {rate:,.0f} msg/s")


def tls_rows(bench: str, samples: Mapping[tuple[str, str], list[float]]) -> list[Row]:
    """What TLS keeps of tidelog's own plaintext speed in the same run: ``value`` with TLS, ``peer_value`` in
    clear (``produce_1k_tls_vs_plaintext``, ``consume_1k_tls_vs_plaintext``)."""
    rows = []
    for tls_metric, plain_metric in (
        (f"produce_{TLS_LABEL}_tls", f"produce_{TLS_LABEL}_nofsync"),
        (f"consume_{TLS_LABEL}_tls", f"consume_{TLS_LABEL}"),
    ):
        with_tls, plain = samples.get(("tidelog", tls_metric)), samples.get(("tidelog", plain_metric))
        if with_tls and plain:
            rows.append(Row(bench, f"{tls_metric}_vs_plaintext", median(with_tls), "msg/s", median(plain)))
    return rows
