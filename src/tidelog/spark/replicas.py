"""Which replica a source task reads from: the ``readFrom`` option (``leader``, ``replica``, ``nearest``).

A follower in a partition's ISR holds every committed record, so a task can read its range there instead of at
the leader (Liftbridge's ``readISRReplica``, Kafka's follower fetching): a big scan then loads every broker
holding a copy, not only the leaders. The follower serves committed records only, below the high watermark it
knows (:mod:`tidelog.api.wire.fetch`), which trails the leader's by at most one replication round trip; a task
whose range ends above it waits at that follower for the next round, as at a leader's tail.

- ``leader`` (the default): every task reads from its partition's leader.
- ``replica``: on the driver, :func:`assign` gives each task one in-sync follower of its partition, the one with
  the fewest tasks of this plan so far (ties: the ISR's order), so the tasks of all partitions spread over all
  followers; a partition with no in-sync follower is read from its leader.
- ``nearest``: the same plan, and in the task :func:`nearest` keeps the planned follower when it is on the task's
  own host, else takes an in-sync replica that is (followers first, then the leader), else keeps the planned one.
  A broker is on the task's host when its advertised address resolves to a loopback address or to one of the
  host name's addresses (:func:`is_local`). PySpark's Python data source API has no preferred locations, so the
  driver cannot send a task to a replica's host; on a cluster where executors and brokers share hosts, the task
  finds the copy that is there. On one machine (every broker on loopback) every replica is local and ``nearest``
  reads what ``replica`` reads.

The follower is a preference: the task's consumer (:class:`~tidelog.client.Consumer` with ``replica``) reads the
leader instead when the follower has left the ISR, cannot be reached, or fails a fetch.
"""

from __future__ import annotations

import functools
import ipaddress
import socket
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace

from tidelog.client import Cluster
from tidelog.protocol.errors import UnavailableError
from tidelog.protocol.messages import StreamInfo
from tidelog.spark.options import ReadFrom
from tidelog.spark.planning import OffsetRange


def assign(tasks: Sequence[OffsetRange], streams: Mapping[str, StreamInfo], read_from: ReadFrom) -> list[OffsetRange]:
    """``tasks`` with a follower each to read from (``replica``), spread evenly; unchanged for ``leader``, for
    tasks of the tiered store, and for partitions without an in-sync follower."""
    if read_from == "leader":
        return list(tasks)
    load: Counter[str] = Counter()
    out: list[OffsetRange] = []
    for task in tasks:
        followers = _followers(streams, task) if not task.segments else []
        if not followers:
            out.append(task)
            continue
        pick = min(followers, key=lambda b: (load[b], followers.index(b)))
        load[pick] += 1
        out.append(replace(task, replica=pick))
    return out


def _followers(streams: Mapping[str, StreamInfo], task: OffsetRange) -> list[str]:
    info = streams.get(task.stream)
    found = next((p for p in info.partitions if p.id == task.partition), None) if info is not None else None
    if found is None or found.leader is None:
        return []
    return [b for b in found.isr if b != found.leader]


async def nearest(cluster: Cluster, task: OffsetRange) -> str | None:
    """``nearest`` in a task: the broker to read ``task`` from (None: the leader), by the rule of the module
    docstring, from the partition's metadata as ``cluster`` sees it now."""
    info = await cluster.partition(task.stream, task.partition, refresh=True)
    local = [b for b in info.isr if _on_this_host(cluster, b)]
    if task.replica in local or not local:
        return task.replica
    followers = [b for b in local if b != info.leader]
    return followers[0] if followers else None  # None: the local replica is the leader


def _on_this_host(cluster: Cluster, broker_id: str) -> bool:
    try:
        host = cluster.broker(broker_id).host
    except UnavailableError:  # not in the metadata (yet): not a candidate
        return False
    return is_local(host)


@functools.cache
def is_local(host: str) -> bool:
    """Whether ``host`` (a name or an address) is this machine: it resolves to a loopback address or to an
    address of this machine's host name. Cached: a task asks for a few brokers, the answer does not change."""
    try:
        addresses = {str(info[4][0]) for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    if any(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses):
        return True
    return bool(addresses & _own_addresses())


@functools.cache
def _own_addresses() -> frozenset[str]:
    try:
        return frozenset(str(info[4][0]) for info in socket.getaddrinfo(socket.gethostname(), None))
    except OSError:
        return frozenset()
