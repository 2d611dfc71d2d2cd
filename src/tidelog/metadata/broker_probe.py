"""Checking a broker reported unreachable: connect to its wire port, and revoke its lease when nothing listens.

Only a *refused* connection counts: it means no process listens on that port, so the broker that registered it
is not running (a crashed or killed broker; its lease would otherwise stay until its TTL runs out). A timeout
proves nothing: a paused (SIGSTOPped) process still has its socket and the kernel still completes connects to
it. The controller answers reports with :func:`probe_and_revoke`; a broker's controller link uses
:func:`probe_refused` to tell a dead controller from a slow one.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from typing import Any

from tidelog.metadata.lease_session import is_lease_not_found
from tidelog.metadata.records import BrokerRecord, Keys, decode_broker

log = logging.getLogger(__name__)


class ProbeOutcome(enum.Enum):
    """What a probe of a broker reported unreachable found when it tried the broker's wire port."""

    REVOKED = "revoked"
    """The connection was refused: nothing listens there. The broker's lease was revoked, failover starts."""
    REACHABLE = "reachable"
    """Something accepted the connection: the reporter's trouble is its own (or the network's)."""
    NO_ANSWER = "no-answer"
    """The connect timed out or failed otherwise: the broker may be paused or cut off; its lease decides."""
    NOT_REGISTERED = "not-registered"
    """The broker is not registered (any more), or re-registered while it was probed: nothing to revoke."""


async def probe_and_revoke(
    client: Any, keys: Keys, broker_id: str, record: BrokerRecord | None, timeout: float, controller_id: str
) -> ProbeOutcome:
    """Probe the wire port of ``broker_id`` (registered as ``record`` in the controller's view); if nothing
    listens there, revoke the lease of its registration, read back and compared with ``record`` first so that a
    broker that re-registered meanwhile keeps its new lease. ``controller_id`` names the controller in logs."""
    if record is None:
        return ProbeOutcome.NOT_REGISTERED
    outcome = await probe_refused(record, timeout)
    if outcome is not None:
        return outcome
    found = await client.get(keys.broker(broker_id))
    if found is None or decode_broker(bytes(found.value)) != record or not found.lease:
        return ProbeOutcome.NOT_REGISTERED
    try:
        await client.revoke_lease(int(found.lease))
    except Exception as error:
        if not is_lease_not_found(error):
            raise
        return ProbeOutcome.NOT_REGISTERED
    log.warning(
        "controller %s: %s refused connections on %s:%d; revoked its lease",
        controller_id,
        broker_id,
        record.host,
        record.wire_port,
    )
    return ProbeOutcome.REVOKED


PROBE_DELAYS = (0.0, 0.02, 0.05, 0.1, 0.25, 0.5)
"""A dying process's listening socket may still complete a connect for a moment after its connections were
reset (the kernel closes a killed process's descriptors one by one), so one successful connect right after a
report proves little: the port is probed a few times over most of a second."""


async def probe_refused(record: BrokerRecord, timeout: float) -> ProbeOutcome | None:
    """None as soon as one of a few connects (:data:`PROBE_DELAYS`) is refused; else the last outcome."""
    outcome: ProbeOutcome | None = ProbeOutcome.NO_ANSWER
    for delay in PROBE_DELAYS:
        await asyncio.sleep(delay)
        outcome = await try_connect(record, timeout)
        if outcome is None:
            return None
    return outcome


async def try_connect(record: BrokerRecord, timeout: float) -> ProbeOutcome | None:
    """Connect to the broker's wire port: None when the connection was refused, what it means otherwise."""
    try:
        async with asyncio.timeout(timeout):
            _, writer = await asyncio.open_connection(record.host, record.wire_port)
    except ConnectionRefusedError:
        return None
    except (TimeoutError, OSError):
        return ProbeOutcome.NO_ANSWER
    writer.close()
    with contextlib.suppress(Exception):
        await writer.wait_closed()
    return ProbeOutcome.REACHABLE
