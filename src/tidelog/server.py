"""The broker process: the composition root that starts every part in order and stops them in reverse.

Start: embedded NATS and etcd when none are configured → connect to both → mirror the metadata keyspace →
partition manager (opens this broker's replicas: leads some, follows others) → the wire protocol server → the
HTTP port (``/metrics``, ``/healthz``, ``/readyz``: not ready until registered) → register the broker under its
etcd lease → campaign for controller → gRPC (``proto.API`` + health).

Stop (SIGTERM/SIGINT): controlled shutdown first — the controller moves this broker's leaderships to other ISR
members and takes it out of the ISRs, so clients fail over without waiting for a lease to lapse — then stop
accepting new requests and let in-flight ones finish (gRPC grace), resign as controller, stop NATS ingest after
appending what it already received, flush and close every log, deregister, close the clients, stop the embedded
servers. Nothing acknowledged is lost, and no child process outlives the broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import time
from typing import Any

from tidelog import telemetry
from tidelog.api.authorizer import Authorizer
from tidelog.api.front.process import FrontSettings
from tidelog.api.front.supervisor import ApiFronts
from tidelog.api.http_access import HttpAccess
from tidelog.api.password_check import PasswordCheck, etcd_users
from tidelog.api.principals import PrincipalResolver
from tidelog.api.rpc.service import GrpcServer
from tidelog.api.server_tls import ServerTls
from tidelog.api.wire.connection_limits import ensure_descriptors
from tidelog.api.wire.server import WireServer
from tidelog.broker.activity_stream import ACTIVITY_CONFIG, ActivityPublisher
from tidelog.broker.config import BrokerConfig, ensure_broker_id
from tidelog.broker.config_security import authorization_enabled
from tidelog.broker.config_values import parse_etcd_endpoint
from tidelog.broker.context import BrokerContext
from tidelog.broker.controller_link import ControllerLink
from tidelog.broker.cursor_stream import CursorStreamKeeper
from tidelog.broker.cursors import CursorStore
from tidelog.broker.embedded import EmbeddedEtcd, EmbeddedNats, start_embedded
from tidelog.broker.encryption import KeyVault, load_master_key
from tidelog.broker.groups.runtime import GroupRuntime
from tidelog.broker.hand_off import hand_off_leadership
from tidelog.broker.ingest.nats_client import BrokerNats
from tidelog.broker.log_settings import log_config_for
from tidelog.broker.manager import PartitionManager
from tidelog.broker.partition_moves import PartitionMoves
from tidelog.broker.partitions.cleaner import LogCleaner
from tidelog.broker.pausing import Pauses
from tidelog.broker.peers import Peers
from tidelog.broker.secure_links import PeerTls, etcd_tls, nats_security
from tidelog.broker.stream_reshape import StreamReshape
from tidelog.broker.streams import StreamAdmin
from tidelog.broker.tier_catalog import TierCatalog
from tidelog.broker.tiering import Tiering, open_tiered_store
from tidelog.launch.endpoints import ENDPOINTS_FILE, Endpoints, remove_endpoints, write_endpoints
from tidelog.launch.ports import PortInUseError, moved_by, port_is_free
from tidelog.launch.reachability import wait_for_etcd
from tidelog.metadata.acl_mirror import AclMirror
from tidelog.metadata.activity import ACTIVITY_STREAM
from tidelog.metadata.activity_feed import ActivityFeed
from tidelog.metadata.controller import Controller
from tidelog.metadata.controller_election import ControllerElection
from tidelog.metadata.etcd_client import open_etcd
from tidelog.metadata.mirror import MetadataMirror
from tidelog.metadata.namespace import internal_subject, namespace_keys
from tidelog.metadata.producer_ids import ProducerIdAllocator
from tidelog.metadata.reassignment import Reassigner
from tidelog.metadata.records import BrokerRecord
from tidelog.metadata.remote_segments import RemoteSegmentLists
from tidelog.metadata.store import MetadataStore
from tidelog.protocol.tls import ClientAuth, following_context
from tidelog.ui.http_server import HttpServer
from tidelog.ui.routes import build_app
from tidelog.ui.view import BrokerView

log = logging.getLogger(__name__)

_ETCD_GONE_BUDGET = 2.0  # seconds for each etcd step of a stop when etcd did not answer a status request


def _refuse_taken_ports(cfg: BrokerConfig) -> None:
    """Fail at once, in one line, when the gRPC or wire port given is taken: before starting NATS and etcd."""
    for what, key, port in (
        ("the Liftbridge gRPC API", "port", cfg.port),
        ("the tidelog wire protocol", "wire_port", cfg.wire_port),
        ("the HTTP port (/metrics, /healthz, /readyz)", "http_port", cfg.http_port),
    ):
        if port and not port_is_free(cfg.host, port):
            raise PortInUseError(what, cfg.host, port, moved_by(key))


def _created_ns(mirror: MetadataMirror, stream: str) -> int | None:
    record = mirror.snapshot.stream(stream)
    return None if record is None else record.created_ns


def server_tls(cfg: BrokerConfig) -> ServerTls | None:
    """The listeners' certificates, loaded now (``TlsConfigError`` if they cannot be used), or None (no TLS)."""
    if cfg.tls_cert is None or cfg.tls_key is None:
        return None
    return ServerTls(
        cfg.tls_cert, cfg.tls_key, client_ca=cfg.tls_client_ca, client_auth=ClientAuth(cfg.tls_client_auth)
    )


class Broker:
    """One tidelog broker. ``await start()``, then ``await stop()`` (or ``async with``)."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = ensure_broker_id(config)
        assert self.config.id is not None
        self.id: str = self.config.id
        self.embedded_nats: EmbeddedNats | None = None
        self.embedded_etcd: EmbeddedEtcd | None = None
        self.nc: Any = None
        self.etcd: Any = None
        self.mirror: MetadataMirror | None = None
        self.store: MetadataStore | None = None
        self.manager: PartitionManager | None = None
        self.grpc: GrpcServer | None = None
        self.fronts: ApiFronts | None = None  # the API front processes (api_front_processes), when there are any
        self.wire: WireServer | None = None
        self.context: BrokerContext | None = None
        self.cleaner: LogCleaner | None = None
        self.tier_catalog: TierCatalog | None = None
        self.tiering: Tiering | None = None
        self.vault = KeyVault(load_master_key(self.config.encryption_key, self.config.encryption_key_file))
        self.peers: Peers | None = None
        self.election: ControllerElection | None = None
        self.controller: Controller | None = None
        self.reassigner: Reassigner | None = None
        self.link: ControllerLink | None = None
        self.cursor_stream: CursorStreamKeeper | None = None
        self.activity_stream: CursorStreamKeeper | None = None
        self.activity: ActivityFeed | None = None
        self.cursors: CursorStore | None = None
        self.groups: GroupRuntime | None = None
        self.http: HttpServer | None = None
        self._registered = False
        self.tls: ServerTls | None = None  # the listeners' certificates, when TLS is on
        self.acls: AclMirror | None = None  # the ACL entries, followed from etcd while authorization is on
        self.authorizer: Authorizer | None = None
        self._peer_tls: PeerTls | None = None  # the links to other brokers' TLS context, when TLS is on
        self._nats_security: dict[str, Any] = {}
        self.pauses: Pauses | None = None
        self._stopped = asyncio.Event()
        self._start_failed = False

    @property
    def nats_urls(self) -> list[str]:
        if self.embedded_nats is not None:
            return [self.embedded_nats.url]
        return list(self.config.nats_servers)

    @property
    def etcd_endpoints(self) -> list[str]:
        if self.embedded_etcd is not None:
            return self.embedded_etcd.endpoints
        return list(self.config.etcd_endpoints)

    async def start(self) -> None:
        cfg = self.config
        cfg.data_dir.mkdir(parents=True, exist_ok=True)
        _refuse_taken_ports(cfg)
        ensure_descriptors(cfg.wire_max_connections)  # an open-file limit too low refuses now, in one line
        telemetry.set_enabled(cfg.metrics_enabled)
        # TLS files and NATS credentials are checked before anything starts: a typo refuses at once, in one line.
        self.tls = server_tls(cfg)
        if self.tls is not None:
            self._peer_tls = PeerTls(cfg, self.tls)
        self._nats_security = nats_security(cfg)
        store = await open_tiered_store(cfg)  # a store it cannot use refuses the start, before anything runs
        try:
            await self._start_backplane()
            keys = namespace_keys(cfg.namespace)
            mirror = self.mirror = MetadataMirror(self.etcd, keys)
            self.store = MetadataStore(self.etcd, keys)
            self.peers = Peers(lambda: mirror.snapshot, ssl=self._peer_tls)
            ttl = max(1, cfg.broker_lease_ttl_ms // 1000)
            # The election calls the controller and the controller asks the election whether its term holds:
            # the callbacks close over the broker so either can be built first.
            self.election = ControllerElection(
                self.etcd,
                keys,
                self.id,
                ttl_seconds=ttl,
                on_elected=lambda term: self._controller().on_elected(term),
                on_deposed=lambda term, reason: self._controller().on_deposed(term, reason),
            )
            self.controller = Controller(
                self.id,
                self.etcd,
                keys,
                mirror,
                self.election,
                unclean_default=cfg.default_unclean_leader_election,
                balance_interval=cfg.leader_balance_interval_ms / 1000,
            )
            delay = cfg.replica_replacement_delay_ms / 1000  # the reassigner is a term task: before the election
            self.reassigner = Reassigner(self.controller, self.etcd, keys, mirror, replacement_delay=delay)
            self.link = ControllerLink(self.id, self.election, self.controller, self.peers, etcd=self.etcd, keys=keys)
            self.manager = PartitionManager(
                self.id,
                cfg.data_dir,
                self.nc,
                lambda stream: log_config_for(cfg, stream),
                ack_timeout=cfg.default_ack_timeout_ms / 1000,
                nats_urls=[] if self._nats_security else self.nats_urls,  # see broker.secure_links
                alter_isr=self.link.alter_isr,
                report_suspension=self.link.suspend_partition,
                on_leader_unreachable=self.link.report_unreachable,
                replica_lag_time_max=cfg.replica_lag_time_max_ms / 1000,
                replica_fetch_wait_max_ms=cfg.replica_fetch_wait_max_ms,
                replica_copy_threshold_bytes=cfg.replica_copy_threshold_bytes,
                replica_ack_poll_us=cfg.replica_ack_poll_us,
                nats_duplicate_window_ms=cfg.nats_duplicate_window_ms,
                nats_max_msg_ids=cfg.nats_max_msg_ids,
                nats_ingest_connections=cfg.nats_ingest_connections,
                namespace=cfg.namespace,
                producer_expiry_ms=cfg.producer_expiry_ms,
                recovery_truncate_damaged=cfg.recovery_truncate_damaged,
                max_open_segment_files=cfg.max_open_segment_files,
                peers=self.peers,
                vault=self.vault,
                peer_ssl=self._peer_tls,
            )
            if store is not None:  # before the mirror opens partitions: their log start includes the store's
                self.tier_catalog = TierCatalog(self.etcd, keys, store, lambda name: _created_ns(mirror, name))
                await self.tier_catalog.start()
                self.manager.tier = self.tier_catalog
            mirror.add_listener(self.manager.reconcile)
            await mirror.start()
            await self.manager.remove_orphans(mirror.snapshot)
            if self.tier_catalog is not None:
                self.tiering = Tiering(
                    self.id,
                    cfg,
                    self.manager,
                    self.tier_catalog,
                    RemoteSegmentLists(self.etcd, keys),
                    interval=cfg.tiered_interval_ms / 1000,
                    janitor=lambda: self.link is not None and self.link.is_local,
                )
                self.tiering.start()
            cap = self.tiering.retention_cap if self.tiering is not None else None
            self.cleaner = LogCleaner(self.manager.replicas, cfg.cleaner_interval_ms / 1000, retention_cap=cap)
            self.cleaner.start()
            self.groups = GroupRuntime(self.id, self.etcd, keys, self.election, mirror, self.link, cfg)
            await self.groups.start()
            admin = StreamAdmin(
                self.id,
                self.store,
                mirror,
                link=self.link,
                vault=self.vault,
                default_encryption=cfg.default_encryption,
                tiered_store=bool(cfg.tiered_store),
            )
            self.pauses = Pauses(
                self.manager,
                admin,
                mirror,
                auto_pause_ms=cfg.auto_pause_time_ms,
                disable_if_subscribers=cfg.auto_pause_disable_if_subscribers,
                cursors_auto_pause_ms=cfg.cursors_stream_auto_pause_time_ms,
            )
            self.cursors = CursorStore(
                self.id, mirror, self.manager, enabled=cfg.cursors_stream_partitions > 0, resume=self.pauses.resume
            )
            mirror.add_listener(self.cursors.on_metadata)
            await self.cursors.on_metadata(mirror.snapshot, mirror.snapshot)
            self.context = BrokerContext(
                self.id,
                cfg,
                self.manager,
                admin,
                mirror,
                self.nc,
                link=self.link,
                peers=self.peers,
                producer_ids=ProducerIdAllocator(self.etcd, keys),
                cursors=self.cursors,
                groups=self.groups.service,
                pauses=self.pauses,
                reshape=StreamReshape(
                    self.id,
                    self.store,
                    mirror,
                    link=self.link,
                    vault=self.vault,
                    tiered_store=bool(cfg.tiered_store),
                    segment_max_bytes=cfg.segment_max_bytes,
                    placements=admin.placements,
                ),
                moves=PartitionMoves(self.id, mirror, self.link, self.reassigner),
            )
            if cfg.activity_stream_enabled:
                publisher = ActivityPublisher(self.id, self.manager, self.peers, lambda: mirror.snapshot)
                self.activity = ActivityFeed(self.etcd, keys, mirror, publisher)
                self.controller.add_term_task("activity", self.activity.run)
            principals = PrincipalResolver.for_broker(cfg.tls_principal_from, cfg.broker_principals, cfg.tls_cert)
            if authorization_enabled(cfg):
                self.acls = AclMirror(self.etcd, keys)
                await self.acls.start()
                self.authorizer = Authorizer(self.acls, cfg.super_users)
                log.info(
                    "authorization on: brokers are %s, super users %s",
                    ", ".join(sorted(principals.broker_names)) or "(none)",
                    ", ".join(sorted(cfg.super_users)) or "(none)",
                )
            users = etcd_users(self.etcd, keys)
            passwords = PasswordCheck(users)
            self.grpc = GrpcServer(
                self.context,
                cfg.host,
                cfg.port,
                tls=self.tls,
                authorizer=self.authorizer,
                principals=principals,
                passwords=passwords,
                fronts=cfg.api_front_processes > 0,
            )
            self.wire = WireServer(
                self.context,
                cfg.host,
                cfg.wire_port,
                ssl=self.tls.context if self.tls is not None else None,
                authorizer=self.authorizer,
                principals=principals,
                users=users,
                max_in_flight=cfg.wire_max_in_flight,
                max_in_flight_bytes=cfg.wire_max_in_flight_bytes,
                max_connections=cfg.wire_max_connections,
                max_connections_per_ip=cfg.wire_max_connections_per_ip,
                idle_timeout=cfg.wire_idle_timeout_ms / 1000,
            )
            if self.tls is not None:
                self.tls.start()
            await self.wire.start()
            await self._start_http(HttpAccess(self.authorizer, principals, passwords) if self.authorizer else None)
            wire_port = cfg.advertise_wire_port or self.wire.port
            record = BrokerRecord(
                self.id, cfg.advertised_host, self.grpc.port, wire_port, time.time_ns(), rack=cfg.rack
            )
            await self.store.register_broker(record, ttl)
            self._registered = True
            await mirror.wait_for(lambda s: self.id in s.brokers, 10)
            await self.election.start()
            await self.election.wait_for(lambda e: e.controller_id is not None, 15)
            self.cursor_stream = CursorStreamKeeper(
                admin,
                mirror,
                self.election,
                partitions=cfg.cursors_stream_partitions,
                replication_factor=cfg.cursors_stream_replication_factor,
                subject=internal_subject(cfg.namespace, "cursors"),
            )
            self.cursor_stream.start()
            self.activity_stream = CursorStreamKeeper(
                admin,
                mirror,
                self.election,
                partitions=1 if cfg.activity_stream_enabled else 0,
                replication_factor=cfg.activity_stream_replication_factor,
                stream=ACTIVITY_STREAM,
                subject=internal_subject(cfg.namespace, "activity"),
                config=ACTIVITY_CONFIG,
            )
            self.activity_stream.start()
            self.pauses.start()
            await self.grpc.start()
            if cfg.api_front_processes:
                self.fronts = ApiFronts(
                    cfg.api_front_processes,
                    FrontSettings(
                        cfg,
                        0,
                        self.grpc.port,
                        self.grpc.internal_port,
                        tuple(self.nats_urls),
                        tuple(self.etcd_endpoints),
                    ),
                )
                await self.fronts.start()
            self._write_endpoints(wire_port)
        except BaseException as exc:
            self._start_failed = not isinstance(exc, asyncio.CancelledError)  # the error says it all
            await self.stop()
            raise
        log.info("broker %s: Liftbridge gRPC API on %s:%d", self.id, cfg.advertised_host, self.grpc.port)
        log.info("broker %s: tidelog wire protocol on %s:%d", self.id, cfg.advertised_host, self.wire.port)
        assert self.http is not None
        log.info("broker %s: HTTP (/metrics, /healthz, /readyz) on %s:%d", self.id, cfg.advertised_host, self.http.port)
        log.info(
            "broker %s: NATS %s, etcd %s, data in %s",
            self.id,
            ",".join(self.nats_urls),
            ",".join(self.etcd_endpoints),
            cfg.data_dir.resolve(),
        )

    async def _start_backplane(self) -> None:
        cfg = self.config
        if cfg.embedded_nats:
            self.embedded_nats = EmbeddedNats(
                cfg.data_dir,
                host="127.0.0.1",
                port=cfg.embedded_nats_port,
                max_payload=max(cfg.max_message_bytes + 64 * 1024, 1024 * 1024),
            )
        if cfg.embedded_etcd:
            self.embedded_etcd = EmbeddedEtcd(cfg.data_dir, host="127.0.0.1", client_port=cfg.embedded_etcd_port)
        await start_embedded(self.embedded_nats, self.embedded_etcd)
        self.nc = BrokerNats(
            self.nats_urls,
            name=f"tidelog-broker-{self.id}",
            security=self._nats_security,
            require_tls=cfg.nats_tls,
        )
        await self.nc.connect()
        self.etcd = open_etcd(
            [parse_etcd_endpoint(e) for e in self.etcd_endpoints],
            timeout=10,
            tls=etcd_tls(cfg),
            user=cfg.etcd_user,
            password=cfg.etcd_password,
        )
        await self.etcd.connect()
        await wait_for_etcd(self.etcd, ",".join(self.etcd_endpoints))

    async def _start_http(self, guard: HttpAccess | None = None) -> None:
        """The HTTP port, reading the parts started so far (see :mod:`tidelog.ui`), checked by ``guard`` if any."""
        assert self.manager is not None and self.mirror is not None and self.election is not None
        assert self.groups is not None
        view = BrokerView(
            self.id,
            self.config,
            self.manager,
            self.mirror,
            self.election,
            self.nc,
            self.etcd,
            cursors=self.cursors,
            groups=self.groups.mirror,
            registered=lambda: self._registered,
            tiering=self.tiering,
        )
        try:
            tls = following_context(self.tls.context) if self.tls is not None else None  # no plaintext with TLS on
            self.http = HttpServer(build_app(view), self.config.host, self.config.http_port, tls=tls, guard=guard)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            what = "the HTTP port (/metrics, /healthz, /readyz)"
            raise PortInUseError(what, self.config.host, self.config.http_port, moved_by("http_port")) from None
        await self.http.start()

    def _write_endpoints(self, wire_port: int) -> None:
        """``<data_dir>/endpoints.json``, so the CLI on this host finds the broker (and its etcd) without flags."""
        assert self.grpc is not None
        host = self.config.advertised_host
        authority = f"[{host}]" if ":" in host else host
        endpoints = Endpoints(
            self.id,
            os.getpid(),
            f"{authority}:{self.grpc.port}",
            f"{authority}:{wire_port}",
            self.nats_urls,
            self.etcd_endpoints,
            self.config.namespace,
        )
        try:
            write_endpoints(self.config.data_dir, endpoints)
        except OSError as exc:  # a convenience for the CLI: the broker serves without it
            log.warning("broker %s: could not write %s: %s", self.id, ENDPOINTS_FILE, exc)

    def _controller(self) -> Controller:
        assert self.controller is not None
        return self.controller

    async def stop(self) -> None:
        """Graceful shutdown; safe to call more than once and after a failed start."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        with contextlib.suppress(OSError):
            remove_endpoints(self.config.data_dir)
        grace = self.config.shutdown_timeout_ms / 1000
        if self.link is not None and self.mirror is not None and self.manager is not None:
            await hand_off_leadership(self.id, self.link, self.mirror, grace)
        if self.fronts is not None:
            await self.fronts.stop(grace=min(grace, 5.0))
        if self.grpc is not None:
            with contextlib.suppress(Exception):
                await self.grpc.stop(grace=min(grace, 5.0))
        if self.wire is not None:
            with contextlib.suppress(Exception):
                await self.wire.stop(grace=min(grace, 5.0))
        if self.http is not None:
            await self.http.stop()
        if self.tls is not None:
            await self.tls.stop()
        if self.pauses is not None:
            await self.pauses.stop()
        if self.cursor_stream is not None:
            await self.cursor_stream.stop()
        if self.activity_stream is not None:
            await self.activity_stream.stop()
        if self.cursors is not None:
            await self.cursors.close()
        # Resigning and deregistering are etcd requests: with etcd gone each would wait out the client's timeout,
        # so they get a short budget then, and the leases expire after their TTL instead.
        etcd_budget = None if await self._etcd_answers() else _ETCD_GONE_BUDGET
        if self.election is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(etcd_budget):
                    await self.election.stop()  # resigns at once: the next controller need not wait for a TTL
        if self.controller is not None:
            with contextlib.suppress(Exception):
                await self.controller.stop()
        if self.groups is not None:
            await self.groups.stop()
        if self.cleaner is not None:
            await self.cleaner.stop()
        if self.tiering is not None:
            await self.tiering.stop()
        if self.tier_catalog is not None:
            await self.tier_catalog.stop()
        if self.manager is not None:
            await self.manager.close()
        if self.peers is not None:
            await self.peers.close()
        if self.store is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(etcd_budget):
                    await self.store.deregister_broker()
        if self.mirror is not None:
            await self.mirror.stop()
        if self.acls is not None:
            await self.acls.stop()
        if self.nc is not None:
            with contextlib.suppress(Exception):
                await self.nc.close()
        if self.etcd is not None:
            with contextlib.suppress(Exception):
                await self.etcd.close()
        embedded = [server.stop() for server in (self.embedded_nats, self.embedded_etcd) if server is not None]
        await asyncio.gather(*embedded, return_exceptions=True)  # together: each may take its stop grace
        log.log(logging.DEBUG if self._start_failed else logging.INFO, "broker %s stopped", self.id)

    async def _etcd_answers(self) -> bool:
        if self.etcd is None or (self.election is None and self.store is None):
            return True  # nothing to resign or deregister
        try:
            async with asyncio.timeout(_ETCD_GONE_BUDGET):
                await self.etcd.status()
        except Exception:
            log.warning("broker %s: etcd does not answer; its leases will expire after their TTL", self.id)
            return False
        return True

    async def __aenter__(self) -> Broker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
