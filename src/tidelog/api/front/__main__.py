"""``python -m tidelog.api.front``: one API front process, started by its broker (:mod:`tidelog.api.front.process`)."""

import sys

from tidelog.api.front.process import run

sys.exit(run())
