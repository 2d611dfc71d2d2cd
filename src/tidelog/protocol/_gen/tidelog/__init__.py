"""Generated modules of package ``tidelog`` (``proto/tidelog/``): see ``tidelog.protocol._gen``."""
