"""The fixed schema of the ``tidelog`` source, as Spark declares it and as the Arrow batches carry it.

======================  =====================================  ====================================================
column                  type                                   holds
======================  =====================================  ====================================================
``key``                 binary                                 the record's key; null when it has none
``value``               binary                                 the record's value; null for a tombstone
``stream``              string                                 the stream's name
``partition``           int                                    the partition within the stream
``offset``              long                                   the record's offset in its partition
``timestamp``           timestamp                              the record's timestamp (stored in ns, truncated to
                                                               Spark's microseconds)
``subject``             string                                 the NATS subject the record arrived on: the
                                                               ``_tl.subject`` header NATS ingest writes for a
                                                               wildcard stream, else the partition's own subject
                                                               (the stream's subject, ``subject.i`` for i > 0)
``headers``             array<struct<key string, value         the record's headers in order (a name may repeat),
                        binary>>                               without tidelog's reserved ``_tl.`` ones; only with
                                                               ``includeHeaders`` (an empty array for a record
                                                               without headers), null otherwise
======================  =====================================  ====================================================

The Arrow schema must equal the one PySpark derives from the Spark schema (it checks the first batch of every
task), which ``tests/spark/test_columns.py`` asserts.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

SPARK_SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("stream", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("subject", StringType()),
        StructField(
            "headers", ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))
        ),
    ]
)
"""The schema as Spark sees it (every field nullable, as Kafka's source declares its own)."""

HEADERS_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")

ARROW_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("stream", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", TIMESTAMP_TYPE),
        ("subject", pa.string()),
        ("headers", HEADERS_TYPE),
    ]
)
"""What every batch the source yields carries: :data:`SPARK_SCHEMA` in Arrow (timestamps in µs, UTC)."""


def partition_subject(subject: str, partition: int) -> str:
    """The NATS subject a partition listens on: the stream's for partition 0, ``subject.i`` after (Liftbridge's
    rule, as :meth:`tidelog.metadata.records.StreamRecord.partition_subject` applies it on the broker)."""
    return subject if partition == 0 else f"{subject}.{partition}"
