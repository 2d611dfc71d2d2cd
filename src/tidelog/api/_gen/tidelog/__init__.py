"""Generated modules of package ``tidelog`` (``proto/tidelog/``): see ``tidelog.api._gen``."""
