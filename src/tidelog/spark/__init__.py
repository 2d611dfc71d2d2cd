"""The ``tidelog`` PySpark data source (installed with the ``tidelog[spark]`` extra)."""
