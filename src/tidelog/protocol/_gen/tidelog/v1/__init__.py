"""Generated modules of package ``tidelog.v1`` (``proto/tidelog/v1/``): see ``tidelog.protocol._gen``."""
