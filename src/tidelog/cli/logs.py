"""How ``tidelog serve`` writes its log: text lines for people, or one JSON object per line for collectors.

``log_format = text`` (the default) keeps the classic ``time level logger: message`` line. ``log_format = json``
writes each record as one JSON object on one line, with these fields::

    {"time": "2026-11-26T17:02:03.456Z", "level": "warning", "logger": "tidelog.broker.partitions.partition",
     "message": "orders/0: followers ['b2'] fell behind; removing them from the ISR",
     "broker": "b0", "stream": "orders", "partition": 0}

``time`` is UTC with milliseconds; ``broker`` is the process's broker id (every line of a broker process is that
broker's, :func:`set_log_context`); context fields (:data:`CONTEXT_FIELDS`: stream, partition, follower, leader,
group, offset, ...) appear when the line was logged with them in ``extra``; a failure's traceback is in
``exception``. Loggers of other libraries (uvicorn, aetcd) come out in the same shape.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, Final

__all__ = ["CONTEXT_FIELDS", "JsonFormatter", "configure_logging", "set_log_context"]

CONTEXT_FIELDS: Final = (
    "stream",
    "partition",
    "replica",
    "follower",
    "leader",
    "leader_epoch",
    "group",
    "offset",
    "path",
    "peer",
)
"""Record attributes (set through ``extra=``) copied into a JSON line when present."""

_TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
_context: dict[str, Any] = {}


def set_log_context(**fields: Any) -> None:
    """Fields every later line of this process carries (``broker``, once the broker id is known)."""
    _context.update(fields)


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        seconds = int(record.created)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
        line: dict[str, Any] = {
            "time": f"{stamp}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            **_context,
        }
        for name in CONTEXT_FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def configure_logging(level: str, log_format: str = "text") -> None:
    """Log to stderr at ``level`` in ``log_format`` (``text`` or ``json``); idempotent."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(_TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    # Third-party chatter (gRPC/etcd internals, the HTTP server) is only interesting when debugging.
    for noisy in ("aetcd", "nats", "grpc", "uvicorn"):
        logging.getLogger(noisy).setLevel(logging.WARNING if level != "debug" else logging.DEBUG)
