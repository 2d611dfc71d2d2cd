"""The ``tidelog`` command line."""
