"""``tidelog top``: a live terminal view of the cluster, the partitions that need attention first.

Every frame reads what ``tidelog cluster status`` reads (:func:`~tidelog.cli.cluster.read_cluster`: the topology
from etcd, each partition's offsets from its leader) and compares it with the frame before: a partition's
throughput is how far its log end moved per second between the two reads. Partitions are sorted by what needs
attention — offline (no live leader), suspended (appends refused), under min ISR (acks-ALL writes refused), at min
ISR (one more loss refuses them), under-replicated, then replication lag (records beyond the high watermark, not
yet on every ISR member) — and then by throughput. The view refreshes in place (rich's ``Live``) every
``--interval`` seconds until Ctrl-C. ``--once`` prints one frame (two reads ``--interval`` apart, so the
throughput is measured) and exits; ``--output json`` prints the frame as JSON (one document per line while live).
``--metrics http://HOST:9294`` (repeatable) adds each partition's largest follower lag in seconds, scraped from
those brokers' ``/metrics`` (a partition's leader exports its followers' lag; etcd does not know brokers' HTTP
ports, so they are given).
"""

from __future__ import annotations

import asyncio
import base64
import enum
import functools
import json
import ssl as ssl_
import time
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import click
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from tidelog.broker.config_values import parse_etcd_endpoint
from tidelog.cli.cluster import ETCD_ENV, ClusterView, read_cluster, status
from tidelog.cli.common import client_credentials, client_tls
from tidelog.metadata.etcd_client import etcd_target
from tidelog.metadata.records import PartitionRecord

__all__ = ["Access", "Attention", "Frame", "Row", "frame_of", "scrape_metrics", "top"]

console = Console()

METRICS_TIMEOUT = 3.0
"""Seconds a broker's ``/metrics`` has to answer ``--metrics`` (one that does not shows ``-``)."""


class Attention(enum.IntEnum):
    """What a partition needs, most urgent first (the sort order of the view)."""

    OFFLINE = 0
    SUSPENDED = 1
    UNDER_MIN_ISR = 2
    AT_MIN_ISR = 3
    UNDER_REPLICATED = 4
    LAGGING = 5
    OK = 6


_STYLE = {
    Attention.OFFLINE: "bold red",
    Attention.SUSPENDED: "bold red",
    Attention.UNDER_MIN_ISR: "bold red",
    Attention.AT_MIN_ISR: "yellow",
    Attention.UNDER_REPLICATED: "yellow",
    Attention.LAGGING: "cyan",
    Attention.OK: "",
}


@dataclass(frozen=True, slots=True)
class Row:
    """One partition in a frame; offsets are None where its leader did not answer."""

    stream: str
    partition: int
    leader: str
    replicas: list[str]
    isr: list[str]
    min_isr: int
    high_watermark: int | None
    log_end: int | None
    lag: int | None
    records_per_second: float | None
    attention: str
    follower_lag_seconds: float | None = None  # from the leader's /metrics, with --metrics


@dataclass(frozen=True, slots=True)
class Frame:
    """The cluster at one moment: brokers alive, the controller, and every partition sorted by attention."""

    at: float
    brokers_alive: int
    brokers_known: int
    controller: str | None
    rows: list[Row]

    def counts(self) -> dict[str, int]:
        found = {a.name.lower(): 0 for a in Attention}
        for row in self.rows:
            found[row.attention] += 1
        return found


def _min_isr(view: ClusterView, partition: PartitionRecord) -> int:
    """The stream's min ISR as the broker computes it: its own setting, else replication factor − 1 (at least 1)."""
    stream = view.streams.get(partition.stream)
    if stream is not None and stream.config.min_isr:
        return stream.config.min_isr
    return max(1, len(partition.replicas) - 1)


def _attention(view: ClusterView, partition: PartitionRecord, min_isr: int, lag: int | None) -> Attention:
    members = len(partition.isr)
    if partition.leader not in view.brokers:
        return Attention.OFFLINE
    if view.suspension(partition):
        return Attention.SUSPENDED
    if members < min_isr:
        return Attention.UNDER_MIN_ISR
    if members == min_isr and members < len(partition.replicas):
        return Attention.AT_MIN_ISR
    if members < len(partition.replicas):
        return Attention.UNDER_REPLICATED
    if lag:
        return Attention.LAGGING
    return Attention.OK


def frame_of(
    view: ClusterView,
    before: ClusterView | None,
    elapsed: float,
    at: float,
    lag_seconds: dict[tuple[str, int], float] | None = None,
) -> Frame:
    """The frame of ``view``, with throughput measured against ``before`` (read ``elapsed`` seconds earlier) and
    the largest follower lag in seconds from ``lag_seconds`` (scraped with ``--metrics``)."""
    rows = []
    for p in view.partitions:
        bounds = view.bounds.get((p.stream, p.id))
        old = before.bounds.get((p.stream, p.id)) if before is not None else None
        lag = bounds.log_end - bounds.high_watermark if bounds is not None else None
        rate = None
        if bounds is not None and old is not None and elapsed > 0:
            rate = max(0, bounds.log_end - old.log_end) / elapsed  # a truncated log (new leader) moved back: 0
        min_isr = _min_isr(view, p)
        attention = _attention(view, p, min_isr, lag)
        rows.append(
            Row(
                p.stream, p.id, p.leader, list(p.replicas), list(p.isr), min_isr,
                bounds.high_watermark if bounds is not None else None,
                bounds.log_end if bounds is not None else None,
                lag, rate, attention.name.lower(),
                lag_seconds.get((p.stream, p.id)) if lag_seconds is not None else None,
            )
        )  # fmt: skip
    rows.sort(
        key=lambda r: (
            Attention[r.attention.upper()],
            -(r.lag or 0),
            -(r.records_per_second or 0),
            r.stream,
            r.partition,
        )
    )
    known = set(view.brokers) | {b for p in view.partitions for b in p.replicas}
    controller = view.controller.broker_id if view.controller is not None else None
    return Frame(at, len(view.brokers), len(known), controller, rows)


_LEFT = {"stream", "leader", "ISR", "attention"}


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}"
    return str(value)


def render(frame: Frame, limit: int | None = None, live: bool = False) -> Group:
    """The frame as a summary line and a table (the ``limit`` most urgent rows); ``live`` adds how to quit."""
    counts = frame.counts()
    summary = Text.assemble(
        (f"brokers {frame.brokers_alive}/{frame.brokers_known} alive", "bold"),
        f"   controller {frame.controller or 'NONE'}   partitions {len(frame.rows)}   ",
        (f"offline {counts['offline']}", "bold red" if counts["offline"] else ""),
        "   ",
        (f"under min ISR {counts['under_min_isr']}", "bold red" if counts["under_min_isr"] else ""),
        "   ",
        (f"at min ISR {counts['at_min_isr']}", "yellow" if counts["at_min_isr"] else ""),
        "   ",
        (f"under-replicated {counts['under_replicated']}", "yellow" if counts["under_replicated"] else ""),
        "   ",
        time.strftime("%H:%M:%S", time.localtime(frame.at)),
    )
    table = Table(expand=False, header_style="bold")
    timed = any(row.follower_lag_seconds is not None for row in frame.rows)
    names = ["stream", "part", "leader", "ISR", "min ISR", "HW", "log end", "lag", "records/s", "attention"]
    if timed:
        names.insert(8, "lag s")
    for name in names:
        table.add_column(
            name,
            justify="right" if name in {"part", "min ISR", "HW", "log end", "lag", "lag s", "records/s"} else "left",
        )
    shown = frame.rows if limit is None else frame.rows[:limit]
    for row in shown:
        table.add_row(
            row.stream, str(row.partition), row.leader or "none", f"{len(row.isr)}/{len(row.replicas)}",
            str(row.min_isr), _cell(row.high_watermark), _cell(row.log_end), _cell(row.lag),
            *((_cell(row.follower_lag_seconds),) if timed else ()),
            _cell(row.records_per_second), row.attention.replace("_", " "),
            style=_STYLE[Attention[row.attention.upper()]] or None,
        )  # fmt: skip
    parts: list[Text | Table] = [summary, table]
    if len(shown) < len(frame.rows):
        parts.append(Text(f"... {len(frame.rows) - len(shown)} more partition(s), all needing less attention"))
    if live:
        parts.append(Text("Ctrl-C to quit", style="dim"))
    return Group(*parts)


def as_json(frame: Frame) -> str:
    body: dict[str, object] = {"at": frame.at, "brokers_alive": frame.brokers_alive}
    body["brokers_known"] = frame.brokers_known
    body |= {"controller": frame.controller, "counts": frame.counts(), "partitions": [asdict(r) for r in frame.rows]}
    return json.dumps(body, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class Access:
    """How the brokers are reached: the ``--tls-*`` context and the ``--user`` login (both None: in clear)."""

    ssl: ssl_.SSLContext | None = None
    credentials: tuple[str, str] | None = None


def scrape_metrics(url: str, access: Access) -> str:
    """One broker's ``/metrics`` text (HTTPS verified with ``access.ssl``; ``access.credentials`` as Basic)."""
    request = urllib.request.Request(url)
    if access.credentials is not None:
        token = base64.b64encode(":".join(access.credentials).encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    with urllib.request.urlopen(request, timeout=METRICS_TIMEOUT, context=access.ssl) as response:
        return bytes(response.read()).decode()


async def follower_lag_seconds(urls: Sequence[str], access: Access = Access()) -> dict[tuple[str, int], float] | None:
    """The largest ``tidelog_follower_lag_seconds`` of each partition over the brokers' ``/metrics`` at ``urls``
    (each leader exports its followers'); a broker that does not answer adds nothing. None without ``urls``."""
    if not urls:
        return None
    bodies = await asyncio.gather(
        *(asyncio.to_thread(scrape_metrics, url, access) for url in urls), return_exceptions=True
    )
    found: dict[tuple[str, int], float] = {}
    for body in bodies:
        if isinstance(body, BaseException):
            continue
        for family in text_string_to_metric_families(body):
            if family.name != "tidelog_follower_lag_seconds":
                continue
            for sample in family.samples:
                key = (sample.labels["stream"], int(sample.labels["partition"]))
                found[key] = max(found.get(key, 0.0), sample.value)
    return found


async def _read_pair(
    endpoints: Sequence[str], namespace: str, interval: float, metrics: Sequence[str], access: Access = Access()
) -> Frame:
    read = functools.partial(read_cluster, endpoints, namespace, ssl=access.ssl, credentials=access.credentials)
    first = await read()
    started = time.monotonic()
    await asyncio.sleep(interval)
    second, lag_seconds = await asyncio.gather(read(), follower_lag_seconds(metrics, access))
    return frame_of(second, first, time.monotonic() - started, time.time(), lag_seconds)


async def _live(
    endpoints: Sequence[str],
    namespace: str,
    interval: float,
    output: str,
    metrics: Sequence[str],
    access: Access = Access(),
) -> None:
    """Frames every ``interval`` seconds until cancelled (Ctrl-C); a failed read shows as a line, then retries."""
    read = functools.partial(read_cluster, endpoints, namespace, ssl=access.ssl, credentials=access.credentials)
    before: ClusterView | None = None
    read_at = time.monotonic()
    with Live(Text("reading the cluster ..."), console=console, auto_refresh=False, transient=False) as live:
        while True:
            try:
                view, lag_seconds = await asyncio.gather(read(), follower_lag_seconds(metrics, access))
            except Exception as exc:  # etcd away for a moment: say so and try again
                live.update(Text(f"cannot read the cluster from etcd: {exc!r}; retrying", style="bold red"))
                live.refresh()
                await asyncio.sleep(interval)
                continue
            now = time.monotonic()
            frame = frame_of(view, before, now - read_at, time.time(), lag_seconds)
            before, read_at = view, now
            if output == "json":
                live.console.print(as_json(frame), soft_wrap=True, highlight=False)
            else:
                live.update(render(frame, max(5, console.size.height - 8), live=True))
                live.refresh()
            await asyncio.sleep(interval)


@click.command("top")
@click.option("--once", is_flag=True, help="Print one frame and exit (for scripts and tests).")
@click.option(
    "--interval",
    "-i",
    type=click.FloatRange(0.2, 3600),
    default=2.0,
    show_default=True,
    help="Seconds between frames; throughput is measured over this span.",
)
@click.option(
    "--metrics",
    "-m",
    "metrics",
    multiple=True,
    metavar="URL",
    help="A broker's HTTP address (http://HOST:9294; repeatable): adds each partition's largest follower lag in "
    "seconds, from the /metrics of the brokers leading it.",
)
def top(
    once: bool, interval: float, metrics: tuple[str, ...], etcd_endpoints: str, namespace: str, output: str
) -> None:
    """A live view of every partition — throughput, lag, ISR — the ones needing attention first, until Ctrl-C."""
    endpoints = [e.strip() for e in etcd_endpoints.split(",") if e.strip()]
    if not endpoints:
        raise click.UsageError(
            f"no etcd endpoints: pass --etcd-endpoints, set {ETCD_ENV}, or give the --data-dir of a running broker"
        )
    try:
        etcd_target([parse_etcd_endpoint(e) for e in endpoints])
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    urls = [_metrics_url(m) for m in metrics]
    access = Access(client_tls(), client_credentials())
    try:
        if once:
            frame = asyncio.run(_read_pair(endpoints, namespace, interval, urls, access))
            if output == "json":
                click.echo(as_json(frame))
            else:
                console.print(render(frame))
            return
        asyncio.run(_live(endpoints, namespace, interval, output, urls, access))
    except KeyboardInterrupt:
        return  # Ctrl-C is how a live view ends
    except Exception as exc:
        raise click.ClickException(f"cannot read the cluster from etcd at {','.join(endpoints)}: {exc!r}") from None


def _metrics_url(address: str) -> str:
    """``http(s)://HOST:PORT[/metrics]`` → the URL of its ``/metrics``; anything else is a usage error."""
    parsed = urllib.parse.urlsplit(address)
    if parsed.scheme not in {"http", "https"} or not parsed.hostname or parsed.path not in {"", "/", "/metrics"}:
        raise click.BadParameter(
            f"{address!r} is not a broker's HTTP address: give http://HOST:PORT (the broker's http_port, 9294)",
            param_hint="--metrics",
        )
    return f"{parsed.scheme}://{parsed.netloc}/metrics"


_SHARED = {"data_dir", "etcd_endpoints", "namespace", "output", "tls_ca", "tls_cert", "tls_key"}
for _param in status.params:  # the same --data-dir, --etcd-endpoints, --namespace, --output, TLS and login flags
    if _param.name in _SHARED | {"user", "password", "password_file"}:
        top.params.append(_param)
