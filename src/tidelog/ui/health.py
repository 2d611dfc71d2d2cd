"""``/healthz`` and ``/readyz``: whether the broker process lives, and whether it can serve.

Orchestrators restart a process whose liveness fails and route no traffic to one that is not ready, so the two
answer different questions:

- ``/healthz``: the event loop answers HTTP. 200 with ``{"status": "ok", "broker": ...}``; nothing else is
  checked (a broker cut off from etcd is alive, and restarting it would not reconnect etcd).
- ``/readyz``: the broker can serve clients. Four checks, each with a line saying what is wrong:
  ``registered`` (its registration is in the metadata, so clients and peers find it), ``metadata`` (the mirror
  of the etcd keyspace is loaded and its watch is up: what the broker acts on is current), ``nats`` (the NATS
  connection is up: streams ingest), ``etcd`` (etcd answers a status request within :data:`ETCD_PROBE_TIMEOUT`).
  200 when all pass, 503 otherwise; the body lists every check and ``not_ready`` names the failing ones.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from tidelog.ui.view import BrokerView

__all__ = ["ETCD_PROBE_TIMEOUT", "Check", "liveness", "readiness"]

ETCD_PROBE_TIMEOUT = 1.0
"""Seconds etcd has to answer ``/readyz``'s status request (a probe's own timeout is usually a few seconds)."""


@dataclass(frozen=True, slots=True)
class Check:
    """One readiness condition: whether it holds, and in words what was found."""

    name: str
    ok: bool
    detail: str


def liveness(view: BrokerView) -> dict[str, object]:
    return {"status": "ok", "broker": view.broker_id}


async def readiness(view: BrokerView) -> tuple[bool, dict[str, object]]:
    """Run every check (the etcd one concurrently with nothing else to wait for); (ready, JSON body)."""
    checks = [_registered(view), _metadata(view), _nats(view), await _etcd(view)]
    ready = all(c.ok for c in checks)
    body: dict[str, object] = {
        "status": "ready" if ready else "not ready",
        "broker": view.broker_id,
        "not_ready": [c.name for c in checks if not c.ok],
        "checks": {c.name: {"ok": c.ok, "detail": c.detail} for c in checks},
    }
    return ready, body


def _registered(view: BrokerView) -> Check:
    if not view.registered():
        return Check("registered", False, "the broker has not registered in etcd yet (starting)")
    if view.broker_id not in view.mirror.snapshot.brokers:
        return Check("registered", False, f"no registration of broker {view.broker_id} in the metadata (lease lost?)")
    return Check("registered", True, f"broker {view.broker_id} is registered")


def _metadata(view: BrokerView) -> Check:
    revision = view.mirror.snapshot.revision
    if not view.mirror.in_sync:
        return Check("metadata", False, f"the metadata watch is down (last revision {revision}); re-watching")
    return Check("metadata", True, f"following etcd at revision {revision}")


def _nats(view: BrokerView) -> Check:
    if not view.nats.is_connected:
        return Check("nats", False, "not connected to NATS; reconnecting (NATS ingest waits)")
    return Check("nats", True, "connected")


async def _etcd(view: BrokerView) -> Check:
    try:
        async with asyncio.timeout(ETCD_PROBE_TIMEOUT):
            await view.etcd.status()
    except TimeoutError:
        return Check("etcd", False, f"etcd did not answer within {ETCD_PROBE_TIMEOUT:g}s")
    except Exception as exc:
        return Check("etcd", False, f"etcd does not answer: {type(exc).__name__}: {exc}"[:300])
    return Check("etcd", True, "answers")
