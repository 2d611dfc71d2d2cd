"""The etcd client of a broker: one connection that fails over between every listed endpoint.

The client library takes one host and port and dials ``host:port`` as a gRPC target. gRPC also takes a static list
of addresses (``ipv4:a:p,b:q`` or ``ipv6:[a]:p,[b]:q``) and then connects to the first that answers, moving on to
the next when it fails (its ``pick_first`` policy). So a list of endpoints becomes one such target; names in it are
resolved once, when the client is made, because a static list holds addresses only. One endpoint stays as given,
and gRPC resolves its name itself. Watches and leases broken by a failover are taken up again by their owners,
as after an etcd restart.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Sequence
from typing import Any


class EtcdEndpointError(ValueError):
    """An endpoint list that cannot become one client (a name that does not resolve, IPv4 mixed with IPv6)."""


def etcd_target(endpoints: Sequence[tuple[str, int]]) -> tuple[str, int]:
    """The ``(host, port)`` to give the client so that its target ``host:port`` lists every endpoint in order."""
    if not endpoints:
        raise EtcdEndpointError("no etcd endpoints")
    if len(endpoints) == 1:
        return endpoints[0]
    addresses = [(_address_of(host, port), port) for host, port in endpoints]
    families = {address.version for address, _ in addresses}
    if len(families) > 1:
        raise EtcdEndpointError(
            f"etcd endpoints mix IPv4 and IPv6 addresses ({_listed(endpoints)}): list endpoints of one family"
        )
    if families == {4}:
        listed = [f"{address}:{port}" for address, port in addresses]
        scheme = "ipv4"
    else:
        listed = [f"[{address}]:{port}" for address, port in addresses]
        scheme = "ipv6"
    last_host = listed[-1].rsplit(":", 1)[0]
    return f"{scheme}:{','.join([*listed[:-1], last_host])}", addresses[-1][1]


def open_etcd(endpoints: Sequence[tuple[str, int]], *, timeout: int) -> Any:
    """An (unconnected) etcd client over ``endpoints``: call ``connect()`` on it."""
    import aetcd  # here, not at the top: the CLI imports this module and starts faster without the client

    host, port = etcd_target(endpoints)
    return aetcd.Client(host=host, port=port, timeout=timeout)


def _address_of(host: str, port: int) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise EtcdEndpointError(f"etcd endpoint {host}:{port}: the name does not resolve ({exc})") from None
    return ipaddress.ip_address(found[0][4][0])


def _listed(endpoints: Sequence[tuple[str, int]]) -> str:
    return ", ".join(f"{host}:{port}" for host, port in endpoints)
