"""The settings of how a broker connects: its identity and listeners, TLS and principals, NATS and etcd.

They are the first keys of :class:`~tidelog.broker.config.BrokerConfig`, which inherits them from
:class:`ConnectionSettings` (so ``dataclasses.fields`` and the generated reference list them first, in this
order) and checks every value, these included, when it is built. Only :class:`~tidelog.broker.config.BrokerConfig`
is built; this class exists so that one module holds one group of keys.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tidelog.broker.config_loading import ID_PATTERN
from tidelog.broker.config_values import (
    NON_NEGATIVE,
    PORT,
    POSITIVE,
    auto_bool_kind,
    bool_kind,
    choice_kind,
    file_kind,
    is_etcd_endpoint,
    is_host,
    is_nats_url,
    is_principal,
    list_kind,
    path_kind,
    setting,
    text_kind,
)
from tidelog.metadata.namespace import DEFAULT_NAMESPACE, NAMESPACE_RULE, is_namespace

RACK_PATTERN = re.compile(r"[A-Za-z0-9_.\-]{0,64}")

__all__ = ["ConnectionSettings"]


@dataclass(frozen=True, slots=True)
class ConnectionSettings:
    """The connection keys of :class:`~tidelog.broker.config.BrokerConfig`, and what follows from them."""

    # -- identity and listeners --
    id: str | None = setting(
        None,
        text_kind("1-64 letters, digits, '_' or '-'", lambda s: ID_PATTERN.fullmatch(s) is not None, optional=True),
        "Broker id, unique in the cluster; it appears in etcd keys and metadata. Unset: generated on first start "
        "and kept in <data_dir>/broker-id.",
    )
    rack: str = setting(
        "",
        text_kind("up to 64 letters, digits, '_', '-' or '.'", lambda s: RACK_PATTERN.fullmatch(s) is not None),
        "The rack (or zone) this broker runs in. New partitions' replicas are spread across racks, so that a "
        "partition survives the loss of a rack when its replication factor is at most the number of racks. "
        "Empty: no rack.",
    )
    host: str = setting("127.0.0.1", text_kind("a host name or IP address", is_host), "Address to listen on.")
    advertise_host: str | None = setting(
        None,
        text_kind("a host name or IP address", is_host, optional=True),
        "Address clients and other brokers are told to connect to. Unset: host (set it when host is 0.0.0.0).",
    )
    port: int = setting(9292, PORT, "gRPC port of the Liftbridge API and the health service (0: any free port).")
    wire_port: int = setting(9293, PORT, "Port of the tidelog wire protocol (0: any free port).")
    advertise_wire_port: int = setting(
        0,
        PORT,
        "Wire port clients and other brokers are told to connect to (behind NAT or a proxy). 0: the wire port.",
    )
    http_port: int = setting(
        9294,
        PORT,
        "HTTP port of /metrics (Prometheus), /healthz, /readyz and the web cluster view at / (0: any free port).",
    )
    data_dir: Path = setting(  # noqa: RUF009  (a Path is immutable, so one default object is safe to share)
        Path("./tidelog-data"),
        path_kind(),
        "Directory of this broker's partitions, its id, and the embedded servers' data and logs.",
    )
    log_level: str = setting("info", choice_kind("debug", "info", "warning", "error"), "Logging threshold.")
    log_format: str = setting(
        "text",
        choice_kind("text", "json"),
        "How log lines are written to stderr: 'text' for people, 'json' for collectors (one object per line with "
        "time, level, logger, message and context fields such as stream, partition and broker).",
    )
    metrics_enabled: bool = setting(
        True,
        bool_kind(),
        "Serve Prometheus metrics on /metrics and time requests, fsyncs and etcd transactions for them. Off: /metrics "
        "answers 404 and nothing is counted (/healthz and /readyz still answer).",
    )
    metrics_partition_level: bool = setting(
        True,
        bool_kind(),
        "Export per-partition series (offsets, high watermark, ISR, lag per follower and per consumer group). "
        "Off: only per-broker totals, for brokers with very many partitions.",
    )

    # -- limits per client (docs/operations.md, "Limits under abuse") --
    wire_max_connections: int = setting(
        0,
        NON_NEGATIVE,
        "Most wire protocol connections open at once, clients and other brokers together (a follower opens one per "
        "partition it follows from this broker). One more is answered with one UNAVAILABLE error frame and "
        "closed. Set, the broker raises its open-file limit (ulimit -n) to fit them and refuses to start when the "
        "hard limit is too low. 0: no limit but the open-file limit.",
    )
    wire_max_connections_per_ip: int = setting(
        0,
        NON_NEGATIVE,
        "Most wire protocol connections open at once from one client address, refused like those over "
        "wire_max_connections, so that one host cannot take every connection. Brokers on one host share one "
        "address, and a follower broker holds one fetch connection to this broker, plus one per partition "
        "while it truncates or copies segment files: leave room for that. 0: no limit.",
    )
    wire_max_in_flight: int = setting(
        256,
        POSITIVE,
        "Requests one wire connection may have unanswered (pipelined); the connection is not read while it has "
        "this many, so a client that pipelines without limit, or never reads its replies, holds at most this "
        "many requests and replies in the broker.",
    )
    wire_max_in_flight_bytes: int = setting(
        64 * 1024 * 1024,
        POSITIVE,
        "Request bytes one wire connection may have unanswered (one request alone always goes through).",
    )
    wire_idle_timeout_ms: int = setting(
        600_000,
        NON_NEGATIVE,
        "A wire connection with nothing in flight that sends no request for this long is closed (clients dial "
        "again when they next need it). 0: never.",
    )
    grpc_max_concurrent_streams: int = setting(
        0,
        NON_NEGATIVE,
        "Calls one gRPC connection may have open at once (HTTP/2 concurrent streams); a client's further calls "
        "wait until one ends. Liftbridge clients open every subscription of a broker on one connection: set it "
        "above the partitions one client subscribes to. 0: gRPC's default (no limit).",
    )
    grpc_max_concurrent_rpcs: int = setting(
        0,
        NON_NEGATIVE,
        "gRPC calls open at once over all connections (each Subscribe is one while it lasts); one more is refused "
        "with RESOURCE_EXHAUSTED. 0: no limit.",
    )
    grpc_idle_timeout_ms: int = setting(
        600_000,
        NON_NEGATIVE,
        "A gRPC connection with no call open for this long is closed (GOAWAY; clients reconnect). 0: never.",
    )

    api_front_processes: int = setting(
        0,
        NON_NEGATIVE,
        "Child processes that serve the Liftbridge gRPC API on port for this broker (API fronts, "
        "docs/performance.md): each listens on port beside the others (SO_REUSEPORT) and the broker itself then "
        "serves gRPC only on a loopback port for them. A front batches PublishAsync into wire protocol produces to "
        "the partition's leader and hands every other call to the broker, so the per-message gRPC work is spread "
        "over processes. Fronts stop with the broker; one that dies is restarted. Not with tls_cert (a front "
        "cannot take the caller's certificate to the broker). 0: the broker serves port itself.",
    )

    # -- TLS (docs/security.md) --
    tls_cert: Path | None = setting(  # noqa: RUF009
        None,
        file_kind("a PEM certificate (chain)"),
        "Certificate of this broker's listeners. Set (with tls_key): the gRPC API and the wire protocol speak TLS "
        "only, and brokers dial each other with TLS. Reloaded when the file changes (no restart).",
    )
    tls_key: Path | None = setting(None, file_kind("a PEM private key"), "Private key of tls_cert.")  # noqa: RUF009
    tls_client_ca: Path | None = setting(  # noqa: RUF009
        None,
        file_kind("a PEM CA bundle"),
        "CA that client certificates must be signed by (needed unless tls_client_auth is 'none').",
    )
    tls_client_auth: str = setting(
        "none",
        choice_kind("none", "optional", "required"),
        "Client certificates: 'none' not asked for; 'optional' asked for on the wire protocol and verified when "
        "given; 'required' a client without a valid one is refused in the handshake (on both listeners). Brokers "
        "present tls_cert to each other, so under 'required' tls_cert must also be valid as a client certificate.",
    )
    tls_ca: Path | None = setting(  # noqa: RUF009
        None,
        file_kind("a PEM CA bundle"),
        "CA this broker verifies other brokers' certificates against when it dials them (replication, "
        "forwarding). Unset: tls_client_ca, else the system's CAs.",
    )

    # -- principals and authorization (docs/security.md) --
    tls_principal_from: str = setting(
        "cn",
        choice_kind("cn", "san"),
        "What names a client with a verified certificate: 'cn' its subject common name; 'san' its first subject "
        "alternative name (DNS name, else URI, else e-mail). Clients without one are the principal ANONYMOUS.",
    )
    broker_principals: tuple[str, ...] = setting(
        (),
        list_kind("principal names", is_principal),
        "Principals that are brokers of this cluster (they may do everything, replication included). Empty: the "
        "name this broker's own tls_cert gives by tls_principal_from.",
    )
    super_users: tuple[str, ...] = setting(
        (),
        list_kind("principal names", is_principal),
        "Principals every ACL check allows (administrators), even while an ACL record cannot be decoded.",
    )
    authz_enabled: bool | None = setting(
        None,
        auto_bool_kind(),
        "Check every gRPC call and wire request against the ACLs in etcd (tidelog acl) before it runs; nothing "
        "allowed is denied. Auto: on exactly when tls_client_auth is 'required'. On needs tls_client_auth "
        "other than 'none' (brokers are recognised by their certificates).",
    )

    # -- NATS and etcd --
    nats_servers: tuple[str, ...] = setting(
        (),
        list_kind("NATS URLs (nats://host:port)", is_nats_url),
        "NATS servers to use. Empty: the broker runs its own nats-server on loopback.",
    )
    etcd_endpoints: tuple[str, ...] = setting(
        (),
        list_kind("etcd endpoints (http://host:port)", is_etcd_endpoint),
        "etcd endpoints to use, members of one etcd cluster: the broker connects to the first that answers and fails "
        "over to the others in order. Empty: the broker runs its own etcd with data under <data_dir>/etcd.",
    )
    namespace: str = setting(
        DEFAULT_NAMESPACE,
        text_kind(NAMESPACE_RULE, is_namespace),
        "The cluster's name in etcd and NATS (Liftbridge's clustering.namespace): every etcd key is under "
        "/<namespace>/ and internal streams listen on _<namespace>.<name>, so clusters of different namespaces "
        "share one etcd and one NATS without seeing each other. Every broker of a cluster sets the same one; "
        "tools that read etcd take it as --namespace.",
    )
    nats_tls_ca: Path | None = setting(  # noqa: RUF009
        None, file_kind("a PEM CA bundle"), "Dial nats_servers with TLS, verifying them against this CA."
    )
    nats_tls_cert: Path | None = setting(  # noqa: RUF009
        None, file_kind("a PEM certificate"), "Client certificate for NATS (with nats_tls_key; implies TLS)."
    )
    nats_tls_key: Path | None = setting(None, file_kind("a PEM private key"), "Private key of nats_tls_cert.")  # noqa: RUF009
    nats_user: str | None = setting(
        None, text_kind("a NATS user name", bool, optional=True), "NATS user (with nats_password)."
    )
    nats_password: str | None = setting(None, text_kind("a password", bool, optional=True), "Password of nats_user.")
    nats_token: str | None = setting(None, text_kind("a token", bool, optional=True), "NATS authentication token.")
    nats_creds: Path | None = setting(  # noqa: RUF009
        None, file_kind("a NATS credentials file (JWT and NKey seed)"), "NATS credentials file (needs nkeys)."
    )
    nats_nkey_seed: Path | None = setting(  # noqa: RUF009
        None, file_kind("a file holding an NKey seed"), "NATS NKey seed file (needs nkeys)."
    )
    etcd_tls_ca: Path | None = setting(  # noqa: RUF009
        None, file_kind("a PEM CA bundle"), "Dial etcd_endpoints with TLS, verifying them against this CA."
    )
    etcd_tls_cert: Path | None = setting(  # noqa: RUF009
        None, file_kind("a PEM certificate"), "Client certificate for etcd (with etcd_tls_key; implies TLS)."
    )
    etcd_tls_key: Path | None = setting(None, file_kind("a PEM private key"), "Private key of etcd_tls_cert.")  # noqa: RUF009
    etcd_user: str | None = setting(
        None, text_kind("an etcd user name", bool, optional=True), "etcd user (with etcd_password)."
    )
    etcd_password: str | None = setting(None, text_kind("a password", bool, optional=True), "Password of etcd_user.")
    embedded_nats_port: int = setting(
        4222, PORT, "Client port of the embedded nats-server, so NATS tools reach it by default (0: any free port)."
    )
    embedded_etcd_port: int = setting(0, PORT, "Client port of the embedded etcd (0: any free port).")

    @property
    def tls(self) -> bool:
        """Whether the listeners speak TLS (and brokers dial each other with it)."""
        return self.tls_cert is not None

    @property
    def nats_tls(self) -> bool:
        return (
            self.nats_tls_ca is not None
            or self.nats_tls_cert is not None
            or any(u.strip().lower().startswith("tls://") for u in self.nats_servers)
        )

    @property
    def etcd_tls(self) -> bool:
        return self.etcd_tls_ca is not None or self.etcd_tls_cert is not None

    @property
    def advertised_host(self) -> str:
        """The host put in metadata for others to connect to."""
        return self.advertise_host or self.host

    @property
    def embedded_nats(self) -> bool:
        return not self.nats_servers

    @property
    def embedded_etcd(self) -> bool:
        return not self.etcd_endpoints
