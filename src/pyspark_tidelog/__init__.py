"""Spark's hook for the ``tidelog`` data source: PySpark registers, by its name, the ``DefaultSource`` of every
top-level module whose name starts with ``pyspark_`` (``pyspark.sql.worker.lookup_data_sources``), so installing
``tidelog[spark]`` makes ``format("tidelog")`` work without a ``register`` call. Imported only by PySpark.

The wheel ships this module with or without the extra. Without it (PyArrow missing, say) there is no
``DefaultSource`` and PySpark skips the module: an exception here would break every Python data source lookup.
"""

try:
    from tidelog.spark.source import TidelogDataSource as DefaultSource
except ImportError:  # pragma: no cover - only without the tidelog[spark] extra
    pass
else:
    __all__ = ["DefaultSource"]
