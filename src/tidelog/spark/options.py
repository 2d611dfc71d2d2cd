"""The source's options: parsed and checked once, when the query is defined, into :class:`SourceOptions`.

Names follow Spark's Kafka source where one applies, so ``format("kafka")`` → ``format("tidelog")`` keeps a
query's options (Spark matches option names case-insensitively, and so does this module):

=========================  ==========================================================================================
option                     meaning
=========================  ==========================================================================================
``brokers``                wire addresses (``host:port``, comma-separated) of any brokers; default
                           ``127.0.0.1:9293``, the embedded default of ``tidelog serve``
``streams``                the streams to read, comma-separated; or
``streamPattern``          a regular expression the whole name must match (streams created later join the query,
                           read from their start)
``startingOffsets``        ``earliest``, ``latest`` (streaming only), or JSON ``{"orders": {"0": 23, "1": -2}}``
                           naming every partition of every stream (-2: earliest, -1: latest). Streaming default
                           ``latest``, batch ``earliest``. A restarted streaming query resumes from its checkpoint.
``startingTimestamp``      ms since the epoch: start each partition at its first record at or after it (its end
                           when there is none); takes precedence over ``startingOffsets``, as in Kafka's source
``endingOffsets``          batch only: ``latest`` (the high watermarks when the query is planned; the default) or
                           JSON as above (-1: latest)
``maxOffsetsPerTrigger``   streaming only: at most this many offsets per micro-batch, shared among the partitions
                           in proportion to their lag (admission control; ``Trigger.AvailableNow`` respects it)
``minOffsetsPerTrigger``   streaming only: wait for at least this many new offsets before a micro-batch, but no
                           longer than ``maxTriggerDelay`` since the last one (Kafka's pair; ignored by
                           ``Trigger.AvailableNow``, which reads what is there)
``maxTriggerDelay``        with ``minOffsetsPerTrigger``: the longest wait, ``<n>ms|s|m|h`` (default ``15m``)
``minPartitions``          at least this many Spark tasks: offset ranges are split in proportion to their size
``maxOffsetsPerSplit``     no Spark task reads more offsets than this (default 500000): a long range is split
``failOnDataLoss``         ``true`` (default): fail when offsets to read are gone (retention, truncation);
                           ``false``: skip them
``includeHeaders``         ``true``: fill the ``headers`` column; ``false`` (default): leave it null
``readFrom``               where tasks fetch: ``leader`` (default); ``replica``: in-sync followers, tasks spread
                           over them (the leader when a partition has none); ``nearest``: an in-sync replica on
                           the task's own host, else as ``replica`` (:mod:`tidelog.spark.replicas`)
``groupId``                streaming only: after each micro-batch, store its end offsets as this consumer group's
                           committed offsets, so ``tidelog group describe`` shows the query's lag (Spark's
                           checkpoint still decides where a restarted query resumes)
``groupIdPrefix``          streaming only: as ``groupId``, the group being ``<prefix>-<random>``, new for each run
                           of the query (Kafka's source's naming)
``tls.ca``                 connect with TLS, verifying the brokers against this CA file (PEM)
``tls.cert``, ``tls.key``  a client certificate and its key (PEM), for brokers that require one (implies TLS).
                           The files are read where each task runs: the same paths on every executor
``sasl.username``,         log in as this tidelog user (SCRAM-SHA-256, ``tidelog user add``), for clients without a
``sasl.password``          certificate; TLS only (``tls.ca``). Spark hides options named ``*password*`` in its UI
                           and logs (``spark.redaction.regex``)
``tieredStore``            the brokers' ``tiered_store`` (``s3://bucket[/prefix]`` or ``file:///path``): offsets
                           offloaded there are read by the executors straight from it, not through a broker
                           (:mod:`tidelog.spark.remote`); needs ``etcd``
``tieredStore.endpoint``,  as the brokers' ``tiered_store_endpoint``, ``_region``, ``_access_key_id`` and
``tieredStore.region``,    ``_secret_access_key``
``tieredStore.accessKeyId``,
``tieredStore.secretAccessKey``
``etcd``                   the cluster's etcd endpoints (``host:port``, comma-separated): where the driver reads
                           the lists of offloaded segments
``etcd.tls.ca``            dial etcd over TLS, verifying it against this CA file (PEM), as the brokers'
                           ``etcd_tls_ca``
``etcd.tls.cert``,         a client certificate and its key (PEM), for an etcd that requires one (implies TLS);
``etcd.tls.key``           read on the driver only (executors never talk to etcd)
``etcd.username``,         an etcd user, as the brokers' ``etcd_user`` and ``etcd_password``; TLS only
``etcd.password``          (``etcd.tls.ca``): a password is never sent in clear
``namespace``              the cluster's namespace in etcd (default ``tidelog``, the brokers' default)
=========================  ==========================================================================================

Anything else, a malformed value, or an option that does not apply to the kind of query (``endingOffsets`` in a
streaming query, ``maxOffsetsPerTrigger`` in a batch one) raises :class:`SourceOptionError` naming the option,
before the query reads anything.
"""

from __future__ import annotations

import json
import re
import ssl as ssl_
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from tidelog.client.cluster import DEFAULT_BOOTSTRAP, parse_address
from tidelog.protocol.tls import TlsFiles, client_context

EARLIEST = -2
"""In JSON offsets: the partition's first offset (Kafka's convention)."""
LATEST = -1
"""In JSON offsets: the partition's high watermark."""

DEFAULT_MAX_OFFSETS_PER_SPLIT = 500_000
GROUP_SUFFIX = 12
MAX_GROUP_ID = 255  # the brokers' rule for group ids (tidelog.metadata.group_records)
"""Hex digits of the random part of a ``groupIdPrefix`` group."""
DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60_000
_DURATION = re.compile(r"(\d+)\s*(ms|s|m|h)")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}

Kind = Literal["batch", "stream"]
ReadFrom = Literal["leader", "replica", "nearest"]
Position = Literal["earliest", "latest"] | dict[tuple[str, int], int]
"""Where reading starts or ends: for every partition alike, or per (stream, partition) (JSON, with -2 and -1)."""

_NAMES = (
    "brokers",
    "streams",
    "streamPattern",
    "startingOffsets",
    "startingTimestamp",
    "endingOffsets",
    "maxOffsetsPerTrigger",
    "minOffsetsPerTrigger",
    "maxTriggerDelay",
    "minPartitions",
    "maxOffsetsPerSplit",
    "failOnDataLoss",
    "includeHeaders",
    "readFrom",
    "groupId",
    "groupIdPrefix",
    "tls.ca",
    "tls.cert",
    "tls.key",
    "sasl.username",
    "sasl.password",
    "tieredStore",
    "tieredStore.endpoint",
    "tieredStore.region",
    "tieredStore.accessKeyId",
    "tieredStore.secretAccessKey",
    "etcd",
    "etcd.tls.ca",
    "etcd.tls.cert",
    "etcd.tls.key",
    "etcd.username",
    "etcd.password",
    "namespace",
)
_TIERED = ("tieredStore.endpoint", "tieredStore.region", "tieredStore.accessKeyId", "tieredStore.secretAccessKey")
_ETCD_SECURITY = ("etcd.tls.ca", "etcd.tls.cert", "etcd.tls.key", "etcd.username", "etcd.password")
_CANONICAL = {name.lower(): name for name in _NAMES}
_STREAM_ONLY = ("maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay", "groupId", "groupIdPrefix")
READ_FROM = ("leader", "replica", "nearest")
_BATCH_ONLY = ("endingOffsets",)


class SourceOptionError(ValueError):
    """An option of the ``tidelog`` source is unknown, malformed or does not apply; ``option`` names it."""

    def __init__(self, option: str, problem: str) -> None:
        super().__init__(f"tidelog source option {option!r}: {problem}")
        self.option = option


@dataclass(frozen=True, slots=True)
class TieredSource:
    """Where the tiered store is, and where the lists of what is in it are (the ``tieredStore*`` and ``etcd``
    options): what lets the executors read offloaded segments themselves."""

    url: str
    etcd: tuple[tuple[str, int], ...]
    namespace: str = "tidelog"
    endpoint: str | None = None
    region: str = "us-east-1"
    access_key_id: str | None = None
    secret_access_key: str | None = None
    etcd_tls: TlsFiles | None = None  # None: etcd in clear
    etcd_credentials: tuple[str, str] | None = field(default=None, repr=False)  # etcd.username/password


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """Every option of one query, checked; what the readers on the driver and in the tasks work from."""

    brokers: tuple[str, ...]
    streams: tuple[str, ...] | None  # exactly one of streams and stream_pattern is set
    stream_pattern: str | None
    starting: Position | None  # None: the kind's default
    starting_timestamp_ms: int | None
    ending: Position
    max_offsets_per_trigger: int | None
    min_partitions: int | None
    max_offsets_per_split: int
    fail_on_data_loss: bool
    include_headers: bool
    given: frozenset[str]  # the options the query set, by canonical name
    tls: TlsFiles | None = None  # None: plaintext (paths, not a context: options travel to the executors)
    credentials: tuple[str, str] | None = field(default=None, repr=False)  # sasl.*: never in a repr
    tiered: TieredSource | None = None  # None: every offset is read through the brokers
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = DEFAULT_MAX_TRIGGER_DELAY_MS
    read_from: ReadFrom = "leader"
    group_id: str | None = None  # groupId: the group whose offsets a streaming query's progress is stored as
    group_id_prefix: str | None = None  # groupIdPrefix: the group is <prefix>-<random>, per run

    def ssl(self) -> ssl_.SSLContext | None:
        """The TLS context for the brokers, made where it is used (a context does not travel to executors)."""
        return client_context(self.tls) if self.tls is not None else None

    def check_kind(self, kind: Kind) -> None:
        """Refuse options that do not apply to a batch or to a streaming query."""
        wrong = _BATCH_ONLY if kind == "stream" else _STREAM_ONLY
        for name in wrong:
            if name in self.given:
                other = "batch" if kind == "stream" else "streaming"
                raise SourceOptionError(name, f"applies to {other} reads only")
        if kind == "batch" and self.starting == "latest":
            raise SourceOptionError("startingOffsets", "'latest' is for streaming reads; a batch read would be empty")
        if isinstance(self.ending, dict) and any(v == EARLIEST for v in self.ending.values()):
            raise SourceOptionError("endingOffsets", "-2 (earliest) is not an ending offset")
        if "maxTriggerDelay" in self.given and self.min_offsets_per_trigger is None:
            raise SourceOptionError("maxTriggerDelay", "applies only with minOffsetsPerTrigger")
        if (self.min_offsets_per_trigger or 0) > (self.max_offsets_per_trigger or self.min_offsets_per_trigger or 0):
            raise SourceOptionError("minOffsetsPerTrigger", "must not exceed maxOffsetsPerTrigger")
        if self.ending == "earliest":
            raise SourceOptionError("endingOffsets", "'earliest' is not an ending offset; use 'latest' or JSON")

    def matches(self, stream: str) -> bool:
        """Whether ``stream`` is one the query reads (its name, or a full match of the pattern)."""
        if self.streams is not None:
            return stream in self.streams
        assert self.stream_pattern is not None
        return re.fullmatch(self.stream_pattern, stream) is not None


def parse_options(options: Mapping[str, str]) -> SourceOptions:
    """Check ``options`` (as Spark hands them to the data source: strings, names in any case)."""
    values: dict[str, str] = {}
    for key, value in options.items():
        name = _CANONICAL.get(key.lower())
        if name is None:
            known = ", ".join(_NAMES)
            raise SourceOptionError(key, f"unknown option (the tidelog source takes {known})")
        values[name] = str(value)
    streams, pattern = _subscription(values)
    return SourceOptions(
        brokers=_brokers(values.get("brokers", DEFAULT_BOOTSTRAP)),
        streams=streams,
        stream_pattern=pattern,
        starting=_position("startingOffsets", values["startingOffsets"]) if "startingOffsets" in values else None,
        starting_timestamp_ms=_integer(values, "startingTimestamp", minimum=0),
        ending=_position("endingOffsets", values.get("endingOffsets", "latest")),
        max_offsets_per_trigger=_integer(values, "maxOffsetsPerTrigger", minimum=1),
        min_partitions=_integer(values, "minPartitions", minimum=1),
        max_offsets_per_split=_integer(values, "maxOffsetsPerSplit", minimum=1) or DEFAULT_MAX_OFFSETS_PER_SPLIT,
        fail_on_data_loss=_boolean(values, "failOnDataLoss", default=True),
        include_headers=_boolean(values, "includeHeaders", default=False),
        given=frozenset(values),
        tls=tls_files(values, SourceOptionError),
        min_offsets_per_trigger=_integer(values, "minOffsetsPerTrigger", minimum=1),
        max_trigger_delay_ms=_duration_ms(values, "maxTriggerDelay", DEFAULT_MAX_TRIGGER_DELAY_MS),
        credentials=sasl_credentials(values, SourceOptionError),
        tiered=_tiered(values),
        read_from=_read_from(values),
        group_id=_group(values, "groupId"),
        group_id_prefix=_group(values, "groupIdPrefix"),
    )


def _read_from(values: Mapping[str, str]) -> ReadFrom:
    text = values.get("readFrom", "leader").strip().lower()
    if text == "replica":
        return "replica"
    if text == "nearest":
        return "nearest"
    if text != "leader":
        raise SourceOptionError("readFrom", f"expected leader, replica or nearest, got {values['readFrom']!r}")
    return "leader"


def _group(values: Mapping[str, str], option: str) -> str | None:
    """``groupId`` or ``groupIdPrefix``: at most one of them, a valid group id by the brokers' rule (a prefix
    leaves room for the random part)."""
    if option not in values:
        return None
    if "groupId" in values and "groupIdPrefix" in values:
        raise SourceOptionError(option, "give groupId or groupIdPrefix, not both")
    value = values[option].strip()
    longest = MAX_GROUP_ID - (GROUP_SUFFIX + 1 if option == "groupIdPrefix" else 0)
    if not value or len(value) > longest:
        raise SourceOptionError(option, f"must be 1 to {longest} characters, got {len(value)}")
    if "/" in value or not value.isprintable() or any(c.isspace() for c in value):
        raise SourceOptionError(option, f"{value!r} may not contain '/', whitespace or unprintable characters")
    return value


def _tiered(values: Mapping[str, str]) -> TieredSource | None:
    """The ``tieredStore*``, ``etcd`` and ``namespace`` options; None without ``tieredStore``."""
    if "tieredStore" not in values:
        for option in (*_TIERED, "etcd", *_ETCD_SECURITY, "namespace"):
            if option in values:
                raise SourceOptionError(option, "applies with tieredStore only")
        return None
    url = values["tieredStore"].strip()
    if not url.startswith(("s3://", "file:///")):
        raise SourceOptionError("tieredStore", f"{url!r} is not s3://bucket[/prefix] or file:///absolute/path")
    if "etcd" not in values:
        raise SourceOptionError("etcd", "tieredStore needs the cluster's etcd endpoints (host:port[,host:port…])")
    endpoints = []
    for address in (a.strip() for a in values["etcd"].split(",")):
        try:
            endpoints.append(parse_address(address))
        except ValueError:
            raise SourceOptionError("etcd", f"{address!r} is not host:port") from None
    if ("tieredStore.accessKeyId" in values) != ("tieredStore.secretAccessKey" in values):
        raise SourceOptionError("tieredStore.accessKeyId", "goes with tieredStore.secretAccessKey: set both or neither")
    namespace = values.get("namespace", "tidelog").strip()
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}", namespace):
        raise SourceOptionError(
            "namespace", f"{namespace!r} is not a namespace (1-64 letters, digits, _ or -, the first not _ or -)"
        )
    return TieredSource(
        url,
        tuple(endpoints),
        namespace,
        values.get("tieredStore.endpoint"),
        values.get("tieredStore.region", "us-east-1"),
        values.get("tieredStore.accessKeyId"),
        values.get("tieredStore.secretAccessKey"),
        *_etcd_security(values),
    )


def _etcd_security(values: Mapping[str, str]) -> tuple[TlsFiles | None, tuple[str, str] | None]:
    """The ``etcd.tls.*`` files and the ``etcd.username``/``etcd.password`` pair (checked as the ``tls.*`` and
    ``sasl.*`` options are: the same rules, for the link to etcd)."""
    renamed = {option.removeprefix("etcd."): values[option] for option in _ETCD_SECURITY if option in values}
    tls = tls_files(renamed, lambda option, problem: SourceOptionError(f"etcd.{option}", problem))
    user, password = values.get("etcd.username"), values.get("etcd.password")
    if user is None and password is None:
        return tls, None
    if user is None or not user.strip() or not password:
        missing = "etcd.username" if user is None or not user.strip() else "etcd.password"
        raise SourceOptionError(missing, "is missing or empty (etcd.username and etcd.password go together)")
    if tls is None:
        raise SourceOptionError("etcd.username", "an etcd password login needs TLS (etcd.tls.ca): never sent in clear")
    return tls, (user.strip(), password)


def tls_files(values: Mapping[str, str], error: Callable[[str, str], Exception]) -> TlsFiles | None:
    """The ``tls.*`` options as files (checked to exist here, on the driver), or None when none is given."""
    paths: dict[str, Path] = {}
    for option in ("tls.ca", "tls.cert", "tls.key"):
        if option in values:
            path = Path(values[option].strip()).expanduser()
            if not path.is_file():
                raise error(option, f"{str(path)!r} is not a file")
            paths[option] = path
    if not paths:
        return None
    if ("tls.cert" in paths) != ("tls.key" in paths):
        raise error("tls.cert" if "tls.cert" not in paths else "tls.key", "tls.cert and tls.key go together")
    return TlsFiles(ca=paths.get("tls.ca"), cert=paths.get("tls.cert"), key=paths.get("tls.key"))


def sasl_credentials(values: Mapping[str, str], error: Callable[[str, str], Exception]) -> tuple[str, str] | None:
    """``sasl.username`` and ``sasl.password`` (both or neither, over TLS only), or None."""
    user, password = values.get("sasl.username"), values.get("sasl.password")
    if user is None and password is None:
        return None
    if user is None or not user.strip():
        raise error("sasl.username", "names no user (sasl.username and sasl.password go together)")
    if password is None or not password:
        raise error("sasl.password", "is missing or empty (sasl.username and sasl.password go together)")
    if not any(option in values for option in ("tls.ca", "tls.cert")):
        raise error("sasl.username", "a password login needs TLS (tls.ca): brokers refuse it without")
    return user.strip(), password


def _subscription(values: Mapping[str, str]) -> tuple[tuple[str, ...] | None, str | None]:
    if ("streams" in values) == ("streamPattern" in values):
        raise SourceOptionError("streams", "give exactly one of 'streams' (a comma-separated list) and 'streamPattern'")
    if "streams" in values:
        names = tuple(dict.fromkeys(name.strip() for name in values["streams"].split(",") if name.strip()))
        if not names:
            raise SourceOptionError("streams", "names no stream")
        return names, None
    pattern = values["streamPattern"]
    try:
        re.compile(pattern)
    except re.error as exc:
        raise SourceOptionError("streamPattern", f"not a regular expression: {exc}") from None
    return None, pattern


def _brokers(value: str) -> tuple[str, ...]:
    addresses = tuple(address.strip() for address in value.split(",") if address.strip())
    if not addresses:
        raise SourceOptionError("brokers", "names no broker (expected host:port[,host:port…])")
    for address in addresses:
        try:
            parse_address(address)
        except ValueError:
            raise SourceOptionError("brokers", f"{address!r} is not host:port") from None
    return addresses


def _position(option: str, value: str) -> Position:
    text = value.strip()
    if text.lower() in ("earliest", "latest"):
        return "earliest" if text.lower() == "earliest" else "latest"
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SourceOptionError(
            option, f"expected 'earliest', 'latest' or JSON offsets, not valid JSON ({exc})"
        ) from None
    if not isinstance(document, dict) or not document:
        raise SourceOptionError(option, 'JSON offsets must be an object {"stream": {"partition": offset, …}, …}')
    out: dict[tuple[str, int], int] = {}
    for stream, partitions in document.items():
        if not isinstance(partitions, dict) or not partitions:
            raise SourceOptionError(option, f'stream {stream!r} needs an object {{"partition": offset, …}}')
        for partition, offset in partitions.items():
            if not (isinstance(partition, str) and partition.isdigit()):
                raise SourceOptionError(option, f"partition {partition!r} of stream {stream!r} is not a number")
            if not isinstance(offset, int) or isinstance(offset, bool) or offset < EARLIEST:
                raise SourceOptionError(
                    option, f"offset {offset!r} of {stream}/{partition} must be an offset, -2 (earliest) or -1 (latest)"
                )
            out[(stream, int(partition))] = offset
    return out


def _integer(values: Mapping[str, str], option: str, *, minimum: int) -> int | None:
    if option not in values:
        return None
    try:
        number = int(values[option].strip())
    except ValueError:
        raise SourceOptionError(option, f"expected an integer, got {values[option]!r}") from None
    if number < minimum:
        raise SourceOptionError(option, f"must be at least {minimum}, got {number}")
    return number


def _duration_ms(values: Mapping[str, str], option: str, default: int) -> int:
    if option not in values:
        return default
    found = _DURATION.fullmatch(values[option].strip().lower())
    if found is None:
        raise SourceOptionError(option, f"expected a duration such as 500ms, 30s, 15m or 1h, got {values[option]!r}")
    return int(found[1]) * _UNIT_MS[found[2]]


def _boolean(values: Mapping[str, str], option: str, *, default: bool) -> bool:
    if option not in values:
        return default
    text = values[option].strip().lower()
    if text not in ("true", "false"):
        raise SourceOptionError(option, f"expected true or false, got {values[option]!r}")
    return text == "true"
