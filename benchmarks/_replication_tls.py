"""The TLS rows of ``benchmarks.replication``: the replicated 1 KiB produce and consume again on clusters with
TLS on every link, against JetStream with TLS and against tidelog in clear in the same run.

- tidelog: ``LocalCluster(tls=True)``: a throwaway CA, TLS on the client ports and between brokers (replica
  fetches), client certificates required and authorization on (the benchmark's client is the super user
  ``admin``, so no ACL is looked up beyond the super-user check).
- JetStream: the same CA's broker certificate on every node's client port and on its routes (mutual TLS between
  nodes, verified against the CA); the client verifies the servers against the CA.

``produce_1k_tls``/``consume_1k_tls``: tidelog with TLS ÷ JetStream with TLS; ``*_tls_vs_plaintext``: tidelog with
TLS ÷ tidelog in clear (``produce_1k``, ``consume_1k`` of the same run).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from benchmarks._common import Row, log, median

__all__ = ["TLS_APPROACH", "TLS_METRICS", "measure_tls", "tls_rows"]

TLS_METRICS = (("produce_1k_tls", "msg/s", 1), ("consume_1k_tls", "msg/s", 1))
TLS_APPROACH = (
    "a throwaway CA; tidelog: LocalCluster(tls=True), TLS on client ports and between brokers, client "
    "certificates required (the client is a super user); JetStream: TLS on client ports and mutual TLS on routes"
)


async def measure_tls(side: Any, payloads: Sequence[bytes], samples: dict[tuple[str, str], list[float]]) -> None:
    """Produce ``payloads`` to a new R3 stream and read them back once, on a side whose links speak TLS."""
    count = len(payloads)
    rate = await side.produce("produce_1k_tls", payloads)
    samples[side.name, "produce_1k_tls"].append(rate)
    log(f"  {side.name} produce_1k_tls: {rate:,.0f} msg/s ({count} messages)")
    rate = await side.consume("produce_1k_tls", count)
    samples[side.name, "consume_1k_tls"].append(rate)
    log(f"  {side.name} consume_1k_tls: {rate:,.0f} msg/s")


def tls_rows(bench: str, samples: Mapping[tuple[str, str], list[float]]) -> list[Row]:
    """What TLS keeps of tidelog's own replicated speed in the same run (``value`` with TLS, ``peer_value``
    in clear)."""
    rows = []
    for tls_metric, plain_metric in (("produce_1k_tls", "produce_1k"), ("consume_1k_tls", "consume_1k")):
        with_tls, plain = samples.get(("tidelog", tls_metric)), samples.get(("tidelog", plain_metric))
        if with_tls and plain:
            rows.append(Row(bench, f"{tls_metric}_vs_plaintext", median(with_tls), "msg/s", median(plain)))
    return rows
