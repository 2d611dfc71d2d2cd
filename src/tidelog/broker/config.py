"""Broker configuration: one frozen :class:`BrokerConfig`, layered from four sources.

Later layers win, key by key: defaults < TOML file (``--config``) < ``TIDELOG_*`` environment variables <
command-line flags (:func:`load_config`; how each layer is read and what it refuses is
:mod:`tidelog.broker.config_loading`). Each value is checked by its key's kind (:mod:`tidelog.broker.config_values`),
and values that contradict each other are refused (:mod:`tidelog.broker.config_checks`), before the broker starts.

A broker's identity outlives its configuration: :func:`ensure_broker_id` fills in ``id`` from
``<data_dir>/broker-id``, creating that file with a new id on first start, and refuses an explicit id that
contradicts it (the data directory belongs to another broker).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from tidelog.broker.config_checks import check_combined
from tidelog.broker.config_connections import ConnectionSettings
from tidelog.broker.config_loading import (
    BROKER_ID_FILE,
    CLIENT_ENV,
    CONFIG_FILE_ENV,
    layered_values,
    settle_broker_id,
)
from tidelog.broker.config_values import (
    NON_NEGATIVE,
    POSITIVE,
    Bad,
    BadConfigValueError,
    Kind,
    bool_kind,
    choice_kind,
    file_kind,
    int_kind,
    setting,
    text_kind,
)

__all__ = [
    "BROKER_ID_FILE",
    "CLIENT_ENV",
    "CONFIG_FILE_ENV",
    "BrokerConfig",
    "config_keys",
    "describe_keys",
    "ensure_broker_id",
    "load_config",
]

_MIB = 1024 * 1024
_DAY_MS = 24 * 60 * 60 * 1000


# ---- the configuration ----


def _is_store_url(text: str) -> bool:
    return text.startswith(("file:///", "s3://")) and len(text) > len("s3://")


@dataclass(frozen=True, slots=True)
class BrokerConfig(ConnectionSettings):
    """Everything one broker is configured with. Durations are milliseconds, sizes bytes. Immutable: a changed
    setting is a new object (``dataclasses.replace``), so components holding one never see it change under them.

    The ``segment_*``, ``retention_*``, ``compact_*`` and ``default_*`` keys are stream defaults: they apply to a
    stream that does not set its own value when it is created.
    """

    # -- writes and acks --
    default_flush_policy: str = setting(
        "always",
        choice_kind("always", "interval", "never"),
        "When appends are fsynced: 'always' before acking (group commit), 'interval' every "
        "default_flush_interval_ms, 'never' (durability from replication alone).",
    )
    default_flush_interval_ms: int = setting(1000, POSITIVE, "fsync period under the 'interval' flush policy.")
    recovery_truncate_damaged: bool = setting(
        False,
        bool_kind(),
        "Let start-up recovery cut a partition's log at a damaged batch that intact batches follow (bit rot, a bad "
        "sector; not a crash), losing those batches. Off: such a single-replica partition (or a leader with no "
        "other in-sync replica) is not opened, and the broker logs the damaged offsets; a follower always cuts "
        "and fetches the range again from its leader. Every cut is logged with its offsets.",
    )
    default_ack_timeout_ms: int = setting(
        5000, POSITIVE, "How long a publish waits for its ack policy to be met before failing with DeadlineExceeded."
    )
    max_message_bytes: int = setting(_MIB, POSITIVE, "Largest message (key, value and headers) a broker accepts.")
    max_timestamp_ahead_ms: int = setting(
        3_600_000,
        POSITIVE,
        "A produced batch or append whose timestamps are further ahead of the broker's clock than this is refused "
        "with INVALID_ARGUMENT: a record stamped in the future would hold its segment back from retention by age "
        "until then (Kafka's message.timestamp.after.max.ms).",
    )
    default_unclean_leader_election: bool = setting(
        False, bool_kind(), "Allow a replica outside the ISR to become leader (loses committed data; opt-in)."
    )
    producer_expiry_ms: int = setting(
        86_400_000,
        POSITIVE,
        "An idempotent producer idle this long (by its newest batch's timestamp) is forgotten by each partition; "
        "a retry after that cannot be deduplicated (Kafka's producer.id.expiration.ms).",
    )

    nats_duplicate_window_ms: int = setting(
        120_000,
        NON_NEGATIVE,
        "NATS messages with a Nats-Msg-Id header are stored once per partition within this window, as JetStream "
        "does (0: no deduplication).",
    )
    nats_max_msg_ids: int = setting(
        100_000,
        POSITIVE,
        "Most Nats-Msg-Id values remembered per partition; beyond it the oldest are forgotten early (a late "
        "duplicate of one is stored again, nothing is lost).",
    )
    nats_ingest_connections: int = setting(
        4,
        POSITIVE,
        "NATS connections the partitions led here share to receive their subjects' messages (opened as needed; "
        "each partition is one subscription on the connection carrying fewest). A partition that falls behind is "
        'paused alone, never the connection (docs/durability.md, "NATS ingest is at most once").',
    )

    # -- transactional appends --
    max_append_bytes: int = setting(
        128 * _MIB,
        POSITIVE,
        "Largest transactional append (its records, as one batch; at most segment_max_bytes, which also bounds "
        "it). Replicas and consumers receive an append whole, so this also bounds their largest fetch response.",
    )
    append_min_rate_bytes: int = setting(
        65_536,
        NON_NEGATIVE,
        "A transactional append whose client streams fewer bytes per second than this, measured over "
        "append_rate_window_ms, is aborted with APPEND_TOO_SLOW (Gazette's minimum append rate; 0: no minimum).",
    )
    append_rate_window_ms: int = setting(
        5_000, POSITIVE, "The window over which append_min_rate_bytes is measured, and the longest pause allowed."
    )
    max_open_appends_per_connection: int = setting(
        64,
        POSITIVE,
        "Most transactional appends one wire connection may have begun and not yet committed or aborted; one "
        "more is refused with OPEN_APPENDS_LIMIT (their records wait in spool files on the data disk).",
    )
    max_open_append_bytes_per_connection: int = setting(
        512 * _MIB,
        POSITIVE,
        "Most record bytes one wire connection's open transactional appends may hold spooled together; the append "
        "whose chunk would pass it fails with OPEN_APPENDS_LIMIT and its spool is dropped. At least the largest "
        "append (max_append_bytes, or segment_max_bytes if smaller).",
    )

    # -- segments, retention, compaction --
    segment_max_bytes: int = setting(256 * _MIB, POSITIVE, "Roll to a new segment file at this size.")
    segment_preallocate_bytes: int = setting(
        4 * _MIB,
        NON_NEGATIVE,
        "Under the 'always' flush policy, zeros written ahead of each active segment's end in the background, so "
        "that an fsynced append overwrites instead of growing the file (a cheaper fsync: no journal commit). "
        "Only while a stream is appended to at under 8 MiB/s. 0: off (no gain on copy-on-write filesystems such as "
        "btrfs or ZFS, where an overwrite allocates anyway).",
    )
    segment_max_age_ms: int = setting(7 * _DAY_MS, NON_NEGATIVE, "Roll a segment this old (0: never by age).")
    retention_max_bytes: int = setting(
        0, NON_NEGATIVE, "Delete the oldest segments beyond this many bytes per partition (0: no limit)."
    )
    retention_max_messages: int = setting(
        0, NON_NEGATIVE, "Delete the oldest segments beyond this many messages per partition (0: no limit)."
    )
    retention_max_age_ms: int = setting(
        7 * _DAY_MS, NON_NEGATIVE, "Delete segments whose newest message is older than this (0: no limit)."
    )
    cleaner_interval_ms: int = setting(5 * 60 * 1000, POSITIVE, "How often retention and compaction run.")
    max_open_segment_files: int = setting(
        512,
        int_kind(16),
        "Segment files this broker holds open at most, over all its partitions: beyond it the least recently used "
        "idle ones are closed and reopened when next read or written, so an idle partition holds no descriptor. A "
        "segment with appends not yet fsynced (flush policy never or interval, until its flush) or in use by a "
        "worker thread stays open past it. Beyond this many partitions written at once, an append may first reopen "
        "its file (one open call). Keep it well below the process's open-file limit (ulimit -n): "
        "docs/operations.md counts the other descriptors a broker holds.",
    )
    compact_enabled: bool = setting(False, bool_kind(), "Key compaction: keep only the newest record per key.")
    compact_delete_retention_ms: int = setting(
        _DAY_MS, NON_NEGATIVE, "How long compaction keeps a tombstone (a keyed record without a value)."
    )
    compact_min_lag_ms: int = setting(
        0,
        NON_NEGATIVE,
        "Compaction never removes a record whose timestamp is younger than this (Kafka's min.compaction.lag.ms), "
        "so a consumer lagging by less sees every record of a compacted stream. 0: no lag. Per stream: "
        "compact_min_lag_ms.",
    )
    compact_max_goroutines: int = setting(
        1,
        int_kind(1, 64),
        "Segment files one compaction of a partition rewrites at the same time, each in a worker thread of its own "
        "(Liftbridge's compactMaxGoroutines; per stream: the CreateStream option of that name).",
    )

    # -- tiered storage --
    tiered_store: str | None = setting(
        None,
        text_kind("file:///absolute/path or s3://bucket[/prefix]", _is_store_url, optional=True),
        "Offload sealed segments to this object store (file:///path: a directory, no server; s3://bucket[/prefix]: "
        "S3 or an S3-compatible server, see tiered_store_endpoint). Every non-compacted stream tiers unless it sets "
        "tiered=false; reads below a broker's local log start come from the store. Unset: no tiering. Checked at "
        "start: a store that refuses the credentials stops the broker; one that does not answer is logged, and "
        "segments stay local until it does.",
    )
    tiered_store_endpoint: str | None = setting(
        None,
        text_kind("an http:// or https:// URL", lambda s: s.startswith(("http://", "https://")), optional=True),
        "The S3-compatible server's URL for an s3:// tiered_store (unset: AWS).",
    )
    tiered_store_region: str = setting("us-east-1", text_kind("a region name", bool), "The S3 region.")
    tiered_store_access_key_id: str | None = setting(
        None, text_kind("an access key id", bool, optional=True), "S3 access key id (with the secret; unset: none)."
    )
    tiered_store_secret_access_key: str | None = setting(
        None,
        text_kind("a secret access key", bool, optional=True),
        "S3 secret access key. Prefer TIDELOG_TIERED_STORE_SECRET_ACCESS_KEY to a config file.",
    )
    tiered_store_timeout_ms: int = setting(30_000, POSITIVE, "Bound on each request to the tiered store.")
    tiered_interval_ms: int = setting(
        5_000,
        POSITIVE,
        "How often the broker's one tiering task offloads sealed segments and applies local retention (a failed "
        "partition backs off on its own, from 0.5 s doubling to 60 s).",
    )
    local_retention_ms: int = setting(
        0,
        NON_NEGATIVE,
        "On a tiered stream, delete offloaded segments from brokers' disks once their newest message is older than "
        "this (0: no limit). Never before their upload is recorded. Per stream: local_retention_ms.",
    )
    local_retention_bytes: int = setting(
        0,
        NON_NEGATIVE,
        "On a tiered stream, delete the oldest offloaded segments from brokers' disks beyond this many bytes per "
        "partition (0: no limit). Per stream: local_retention_bytes.",
    )

    # -- encryption at rest --
    encryption_key: str | None = setting(
        None,
        text_kind("32 bytes, base64-encoded", lambda _: True, optional=True),
        "The master key that wraps every encrypted partition's data keys (AES-256-GCM): 32 random bytes, base64 "
        "(openssl rand -base64 32). Prefer TIDELOG_ENCRYPTION_KEY or encryption_key_file to a config file. Every "
        "broker that may lead an encrypted partition needs the same key; tidelog never stores it.",
    )
    encryption_key_file: Path | None = setting(  # noqa: RUF009  (None: nothing shared)
        None,
        file_kind("a file holding the master key"),
        "A file holding the master key (the same base64 text as encryption_key), instead of encryption_key.",
    )
    default_encryption: bool = setting(
        False,
        bool_kind(),
        "Encrypt new streams at rest unless their CreateStream says otherwise (Liftbridge's encryption option; "
        "internal streams such as __cursors are not encrypted by this default). Needs the master key.",
    )
    auto_pause_time_ms: int = setting(
        0,
        NON_NEGATIVE,
        "Pause a partition that has received no message for this long (its log and NATS subscription are closed "
        "until a publish or a subscribe with resume reopens it); a stream's autoPauseTime overrides it. 0: never "
        "(Liftbridge's streams.auto.pause.time).",
    )
    auto_pause_disable_if_subscribers: bool = setting(
        False,
        bool_kind(),
        "Never auto-pause a partition while anyone reads it (a gRPC subscription, or a wire fetch in the last "
        "few seconds); a stream's autoPauseDisableIfSubscribers overrides it.",
    )

    # -- replication and membership --
    replica_lag_time_max_ms: int = setting(
        15_000, POSITIVE, "A follower behind the leader for longer than this leaves the ISR."
    )
    replica_fetch_wait_max_ms: int = setting(
        500, POSITIVE, "Longest a follower's fetch waits at the leader for new data (long poll)."
    )
    replica_copy_threshold_bytes: int = setting(
        256 * _MIB,
        NON_NEGATIVE,
        "A follower this far behind (or behind the leader's log start) copies sealed segment files instead of "
        "fetching batches (far-horizon catch-up). 0: copy only when behind the log start.",
    )
    replica_ack_poll_us: int = setting(
        500,
        NON_NEGATIVE,
        "After an acks-ALL write that waits alone for its commit is fsynced, the leader polls its sockets for this "
        "long instead of sleeping (stopping early when it passes the next write to its followers), so the "
        "followers' acknowledgements and the producer's next write need not wake it: lower latency where waking an "
        "idle CPU is dear (virtual machines), for up to this much leader CPU per such write. 0: "
        "sleep (a leader sharing its CPUs with other busy work).",
    )
    broker_lease_ttl_ms: int = setting(
        10_000,
        int_kind(1000),
        "TTL of the etcd lease that proves this broker alive; the controller fails it over after it lapses "
        "(etcd rounds it up to whole seconds).",
    )
    leader_balance_interval_ms: int = setting(
        30_000,
        POSITIVE,
        "How often the controller moves leadership back to each partition's preferred replica (the first one) "
        "once that replica is back in the ISR.",
    )
    replica_replacement_delay_ms: int = setting(
        600_000,
        NON_NEGATIVE,
        "How long a broker that holds replicas may be gone (no registration) before the controller re-places its "
        "replicas on live brokers, rack-aware, as reassignments: each new replica catches up and joins the ISR "
        "before the gone one is dropped, so no partition goes below min-ISR on the way; a reassignment whose "
        "target names such a broker is re-targeted to a live one. 0 turns it off. The "
        "default (10 minutes) outlasts a restart or an upgrade, which should not copy whole replicas.",
    )
    shutdown_timeout_ms: int = setting(
        15_000, POSITIVE, "On SIGTERM, how long to hand partition leadership off before exiting anyway."
    )

    # -- cursors (consumer positions in the internal stream __cursors) --
    cursors_stream_auto_pause_time_ms: int = setting(
        60_000,
        NON_NEGATIVE,
        "Pause a __cursors partition that has stored no cursor for this long (Liftbridge's default: a minute); "
        "the next cursor request resumes it and reads its cursors again. 0: never.",
    )
    cursors_stream_partitions: int = setting(
        1,
        int_kind(0, 1000),
        "Partitions of the internal compacted stream __cursors that stores cursors (SetCursor, FetchCursor, "
        "committed offsets); the controller creates it. A cursor lives in partition crc32(key) % partitions, "
        "where key is 'cursorId,stream,partition' (Liftbridge's rule). 0: cursors are disabled (cursor requests "
        "answer UNSUPPORTED). Read when __cursors is created: changing it later has no effect.",
    )
    cursors_stream_replication_factor: int = setting(
        -1,
        int_kind(-1, 100),
        "Replicas of each __cursors partition. -1: every broker alive when the controller creates the stream "
        "(Liftbridge's default); 0: 1; n > 0: the controller waits until n brokers are alive, then creates it (set n "
        "in a cluster, so that the stream never starts with fewer replicas because brokers were still starting). "
        "Read when __cursors is created.",
    )
    # -- the activity stream (metadata changes in the internal stream __activity) --
    activity_stream_enabled: bool = setting(
        True,
        bool_kind(),
        "Publish one event per committed metadata change (stream created, deleted, paused, resumed, set read-only; "
        "consumer joined or left a group) to the internal stream __activity, as Liftbridge's ActivityStreamEvent. "
        "The controller creates the stream and publishes at least once: readers drop an event id seen before "
        "(tidelog activity does).",
    )
    activity_stream_replication_factor: int = setting(
        -1,
        int_kind(-1, 100),
        "Replicas of __activity, as cursors_stream_replication_factor is for __cursors (set n in a cluster). Read "
        "when __activity is created.",
    )
    # -- consumer groups --
    group_consumer_timeout_ms: int = setting(
        15_000,
        POSITIVE,
        "A consumer group member that has not fetched its assignments (its heartbeat) for this long is removed "
        "from the group by the coordinator and its partitions reassigned (Liftbridge's groups.consumer.timeout).",
    )
    group_coordinator_timeout_ms: int = setting(
        15_000,
        POSITIVE,
        "Members that get no answer from their group's coordinator for this long report it; reports from more "
        "than half of the members within this time of each other move the group to another coordinator "
        "(Liftbridge's groups.coordinator.timeout).",
    )

    def __post_init__(self) -> None:
        # Every value goes through its key's kind, also when the class is built directly: checked, and
        # normalised (a list becomes a tuple, a str path a Path) so that the object really is immutable.
        for each in dataclasses.fields(self):
            value = getattr(self, each.name)
            try:
                object.__setattr__(self, each.name, each.metadata["kind"].parse(value))
            except Bad as bad:
                raise BadConfigValueError(each.name, "BrokerConfig arguments", value, bad.expected) from None
        check_combined(self)

    def __repr__(self) -> str:
        shown = ", ".join(
            f"{name}={'<hidden>' if name == 'encryption_key' and value else repr(value)}"
            for name, value in ((each.name, getattr(self, each.name)) for each in dataclasses.fields(self))
        )
        return f"BrokerConfig({shown})"  # the master key never reaches a log line or a traceback


_FIELDS: Final = {each.name: each for each in dataclasses.fields(BrokerConfig)}


def config_keys() -> tuple[str, ...]:
    """Every configuration key, in declaration order."""
    return tuple(_FIELDS)


def describe_keys() -> dict[str, str]:
    """Key → what it is for, its default and what it accepts (for ``--help`` texts and documentation)."""
    described = {}
    for name, each in _FIELDS.items():
        kind: Kind = each.metadata["kind"]
        described[name] = f"{each.metadata['doc']} Default: {_show(each.default)}. Accepts {kind.expected}."
    return described


def _show(default: object) -> str:
    if default is None:
        return "unset"
    if isinstance(default, bool):
        return str(default).lower()
    if isinstance(default, tuple):
        return ",".join(default) or "empty"
    return str(default)


# ---- loading ----


def load_config(
    config_file: Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, object] | None = None,
    settings: Mapping[str, str] | None = None,
) -> BrokerConfig:
    """Layer the defaults, the TOML ``config_file``, ``TIDELOG_*`` variables of ``env`` (default: the process
    environment), ``settings`` (``serve -s KEY=VALUE``) and ``flags`` (only the flags the user gave; ``None``
    values count as not given).

    The broker id is not resolved here (that touches the data directory): see :func:`ensure_broker_id`.
    """
    values = layered_values(_FIELDS, config_file, env=env, flags=flags, settings=settings)
    return BrokerConfig(**values)  # type: ignore[arg-type]  # each value was parsed by its key's kind


def ensure_broker_id(config: BrokerConfig) -> BrokerConfig:
    """Return ``config`` with its broker id settled against ``<data_dir>/broker-id``
    (:func:`~tidelog.broker.config_loading.settle_broker_id`: stored on first start, refused when it contradicts
    the stored one)."""
    return dataclasses.replace(config, id=settle_broker_id(config.data_dir, config.id))
