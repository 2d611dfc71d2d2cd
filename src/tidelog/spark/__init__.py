"""The ``tidelog`` PySpark data source: tidelog streams in Spark batch and Structured Streaming queries.

Installed with the ``tidelog[spark]`` extra (PySpark ≥ 4.2 and PyArrow; ``import tidelog`` never imports
PySpark). Spark finds it by itself: PySpark registers the ``DefaultSource`` of every top-level module named
``pyspark_*`` on the Python path when a query first looks up a Python data source, and the extra installs
``pyspark_tidelog``. :func:`register` does the same explicitly (``spark.dataSource.register``)::

    import tidelog.spark
    tidelog.spark.register(spark)

    orders = (
        spark.readStream.format("tidelog")             # format("kafka") → format("tidelog")
        .option("brokers", "127.0.0.1:9293")
        .option("streams", "orders")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", 100_000)
        .load()
    )

Executors run the source in PySpark's Python workers: ``PYSPARK_PYTHON`` must name an interpreter that has
tidelog installed, or the workers cannot import it (``spark.pyspark.python`` covers the tasks, but PySpark 4.3
looks data sources up by name with ``PYSPARK_PYTHON`` alone).

Modules (all but this one are the implementation):

- :mod:`~tidelog.spark.source` — :class:`TidelogDataSource`, its batch and streaming readers;
- :mod:`~tidelog.spark.options` — the options, checked (the table of them is there);
- :mod:`~tidelog.spark.schema` — the columns;
- :mod:`~tidelog.spark.planning` — offsets, admission control, splitting ranges into tasks;
- :mod:`~tidelog.spark.topology` — what the driver asks the brokers;
- :mod:`~tidelog.spark.reading` and :mod:`~tidelog.spark.columns` — what a task does: fetch, and turn record
  batches into Arrow record batches without a Python object per record.
- :mod:`~tidelog.spark.remote` — offloaded segments planned from etcd and read by the tasks straight from the
  tiered store (the ``tieredStore`` option).
- :mod:`~tidelog.spark.sink` — the sink's writers; :mod:`~tidelog.spark.sink_options` its options and columns;
  :mod:`~tidelog.spark.writing` how its tasks group rows by partition; :mod:`~tidelog.spark.sink_commit` how
  each task appends its rows for a partition in one transactional append, fenced by the partition's registers
  (:mod:`~tidelog.spark.sink_fence`) so that a retried task or a replayed micro-batch writes nothing twice
  (design and proof sketch: ``docs/design/spark-sink.md``).

Each record is a row: ``key``, ``value`` (binary), ``stream``, ``partition``, ``offset``, ``timestamp``,
``subject`` and ``headers``; committed records only, as every tidelog consumer sees them.

The sink writes a DataFrame's ``value`` (and ``key``, ``headers``, ``partition``, ``stream``) columns, exactly
once in a streaming query::

    counts.writeStream.format("tidelog").option("stream", "counts").option("checkpointLocation", path).start()
"""

from tidelog.spark.options import SourceOptionError
from tidelog.spark.reading import DataLossError
from tidelog.spark.schema import ARROW_SCHEMA, SPARK_SCHEMA
from tidelog.spark.sink_commit import SinkCommitError
from tidelog.spark.sink_options import SinkOptionError, SinkSchemaError
from tidelog.spark.source import TidelogDataSource, register
from tidelog.spark.writing import SinkRowError

__all__ = [
    "ARROW_SCHEMA",
    "SPARK_SCHEMA",
    "DataLossError",
    "SinkCommitError",
    "SinkOptionError",
    "SinkRowError",
    "SinkSchemaError",
    "SourceOptionError",
    "TidelogDataSource",
    "register",
]
