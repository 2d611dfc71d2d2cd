"""The sink's options and columns, checked on the driver when a write or a streaming query starts.

Options (names in any case, as Spark hands them over):

=========================  ==========================================================================================
option                     meaning
=========================  ==========================================================================================
``brokers``                wire addresses (``host:port``, comma-separated) of any brokers; default
                           ``127.0.0.1:9293``, the embedded default of ``tidelog serve``
``stream``                 the stream every row is written to. Without it each row names its own in a ``stream``
                           column; with it a ``stream`` column is ignored — Kafka's rule for ``topic``, so a
                           DataFrame read from tidelog (whose rows carry their source stream) is written where the
                           option says, never back to where it came from
``tls.ca``, ``tls.cert``,  TLS to the brokers, as the source takes them (:mod:`tidelog.spark.options`)
``tls.key``
``sasl.username``,         a password login (SCRAM-SHA-256, over TLS only), as the source takes it
``sasl.password``
``registerSlots``          streaming only (a batch write refuses it): registers a query keeps per partition, 1–32
                           (default 8), the same for the life of its checkpoint. Tasks of one slot take turns on
                           its register; tasks of different slots write a partition at once
                           (:mod:`~tidelog.spark.sink_fence`). At least the tasks a cluster runs at once; fewer
                           leave more of a partition's 64 registers to other queries
``checkpointLocation``,    Spark's own (it passes them to the sink): accepted, not used — the sink identifies a
``queryName``              streaming query by the id Spark keeps in its checkpoint (:mod:`~tidelog.spark.sink_commit`)
=========================  ==========================================================================================

Columns (matched case-insensitively, as Spark resolves names by default; others are ignored, as Kafka's sink
ignores them, so the source's ``offset``, ``timestamp`` and ``subject`` may stay):

======================  =================================================  =========================================
column                  type                                               holds
======================  =================================================  =========================================
``value`` (required)    binary or string (UTF-8)                           the record's value; null: a tombstone
``key``                 binary or string                                   the record's key; null: none
``headers``             array<struct<key string, value binary|string>>     the record's headers, in order (null or
                        or map<string, binary|string>                      empty: none; a null header value: empty)
``partition``           any integer type                                   the target partition; null: chosen
                                                                           from the key (tidelog's
                                                                           :class:`~tidelog.client.DefaultPartitioner`)
``stream``              string                                             the target stream when there is no
                                                                           ``stream`` option
======================  =================================================  =========================================

A bad option raises :class:`SinkOptionError` and a bad column :class:`SinkSchemaError`, each naming what is
wrong, before anything runs.
"""

from __future__ import annotations

import dataclasses
import ssl as ssl_
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Literal

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    ByteType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
)

from tidelog.client.cluster import DEFAULT_BOOTSTRAP, parse_address
from tidelog.protocol.tls import TlsFiles, client_context
from tidelog.spark.options import sasl_credentials, tls_files
from tidelog.spark.sink_fence import DEFAULT_SLOTS, MAX_SLOTS

_NAMES = ("brokers", "stream", "registerSlots", "tls.ca", "tls.cert", "tls.key", "sasl.username", "sasl.password")
_SPARKS_OWN = ("checkpointLocation", "queryName")  # set by Spark's DataStreamWriter itself
_CANONICAL = {name.lower(): name for name in (*_NAMES, *_SPARKS_OWN)}

COLUMNS = ("value", "key", "headers", "partition", "stream")

Bytes = Literal["binary", "string"]
HeadersShape = Literal["array", "map"]


class SinkOptionError(ValueError):
    """An option of the ``tidelog`` sink (or the write's mode) is unknown or malformed; ``option`` names it."""

    def __init__(self, option: str, problem: str) -> None:
        super().__init__(f"tidelog sink option {option!r}: {problem}")
        self.option = option


class SinkSchemaError(ValueError):
    """The DataFrame written to the ``tidelog`` sink lacks a column or has one of the wrong type; ``column``
    names it."""

    def __init__(self, column: str, problem: str) -> None:
        super().__init__(f"tidelog sink column {column!r}: {problem}")
        self.column = column


@dataclass(frozen=True, slots=True)
class SinkOptions:
    """The options of one write, checked."""

    brokers: tuple[str, ...]
    stream: str | None  # None: every row names its stream in the ``stream`` column
    tls: TlsFiles | None = None  # None: plaintext
    credentials: tuple[str, str] | None = dataclasses.field(default=None, repr=False)  # sasl.*: never in a repr
    slots: int = DEFAULT_SLOTS  # registers per query and partition (streaming)

    def ssl(self) -> ssl_.SSLContext | None:
        """The TLS context for the brokers, made where it is used (a context does not travel to executors)."""
        return client_context(self.tls) if self.tls is not None else None


@dataclass(frozen=True, slots=True)
class SinkColumns:
    """Where the sink finds each of its columns in the written DataFrame (by its name there) and in what shape.
    ``None``: the DataFrame has no such column (or, for ``stream``, the option overrides it)."""

    value: str
    value_type: Bytes
    key: str | None = None
    headers: str | None = None
    headers_shape: HeadersShape | None = None
    partition: str | None = None
    stream: str | None = None


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    """Check ``options`` as Spark hands them to the data source (strings, names in any case)."""
    values: dict[str, str] = {}
    for key, value in options.items():
        name = _CANONICAL.get(key.lower())
        if name is None:
            raise SinkOptionError(key, f"unknown option (the tidelog sink takes {', '.join(_NAMES)})")
        values[name] = str(value)
    stream = values.get("stream")
    if stream is not None and not stream.strip():
        raise SinkOptionError("stream", "names no stream")
    return SinkOptions(
        brokers=_brokers(values.get("brokers", DEFAULT_BOOTSTRAP)),
        stream=stream and stream.strip(),
        tls=tls_files(values, SinkOptionError),
        credentials=sasl_credentials(values, SinkOptionError),
        slots=_slots(values.get("registerSlots", str(DEFAULT_SLOTS))),
    )


def check_columns(schema: StructType, options: SinkOptions) -> SinkColumns:
    """Find the sink's columns in ``schema``, the written DataFrame's, and check their types."""
    found: dict[str, tuple[str, DataType]] = {}
    for field in schema.fields:
        column = field.name.lower()
        if column not in COLUMNS:
            continue
        if column in found:
            raise SinkSchemaError(column, f"two columns are named so ({found[column][0]!r}, {field.name!r})")
        found[column] = (field.name, field.dataType)
    if "value" not in found:
        raise SinkSchemaError("value", "missing: the DataFrame needs a value column (binary or string)")
    value_name, value_type = found["value"]
    columns = SinkColumns(value=value_name, value_type=_bytes("value", value_type))
    if "key" in found:
        name, kind = found["key"]
        _bytes("key", kind)
        columns = replace(columns, key=name)
    if "headers" in found:
        name, kind = found["headers"]
        columns = replace(columns, headers=name, headers_shape=_headers("headers", kind))
    if "partition" in found:
        name, kind = found["partition"]
        if not isinstance(kind, ByteType | ShortType | IntegerType | LongType):
            raise SinkSchemaError("partition", f"must be an integer type, not {kind.simpleString()}")
        columns = replace(columns, partition=name)
    if "stream" in found and options.stream is None:
        name, kind = found["stream"]
        if not isinstance(kind, StringType):
            raise SinkSchemaError("stream", f"must be a string, not {kind.simpleString()}")
        columns = replace(columns, stream=name)
    if options.stream is None and columns.stream is None:
        raise SinkOptionError("stream", "missing: set the stream option, or give each row a stream column")
    return columns


def _bytes(column: str, kind: DataType) -> Bytes:
    if isinstance(kind, BinaryType):
        return "binary"
    if isinstance(kind, StringType):
        return "string"
    raise SinkSchemaError(column, f"must be binary or string, not {kind.simpleString()}")


def _headers(column: str, kind: DataType) -> HeadersShape:
    wanted = "array<struct<key: string, value: binary>> or map<string, binary> (string values are allowed)"
    if isinstance(kind, MapType):
        if isinstance(kind.keyType, StringType) and isinstance(kind.valueType, BinaryType | StringType):
            return "map"
    elif isinstance(kind, ArrayType) and isinstance(kind.elementType, StructType):
        fields = {field.name: field.dataType for field in kind.elementType.fields}
        if (
            set(fields) == {"key", "value"}
            and isinstance(fields["key"], StringType)
            and isinstance(fields["value"], BinaryType | StringType)
        ):
            return "array"
    raise SinkSchemaError(column, f"must be {wanted}, not {kind.simpleString()}")


def _brokers(value: str) -> tuple[str, ...]:
    addresses = tuple(address.strip() for address in value.split(",") if address.strip())
    if not addresses:
        raise SinkOptionError("brokers", "names no broker (expected host:port[,host:port…])")
    for address in addresses:
        try:
            parse_address(address)
        except ValueError:
            raise SinkOptionError("brokers", f"{address!r} is not host:port") from None
    return addresses


def _slots(value: str) -> int:
    text = value.strip()
    if not text.isdigit() or not 1 <= int(text) <= MAX_SLOTS:
        raise SinkOptionError("registerSlots", f"{value!r} is not a whole number from 1 to {MAX_SLOTS}")
    return int(text)
