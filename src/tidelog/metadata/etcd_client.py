"""The etcd client of a broker: one connection that fails over between every listed endpoint.

The client library takes one host and port and dials ``host:port`` as a gRPC target. gRPC also takes a static list
of addresses (``ipv4:a:p,b:q`` or ``ipv6:[a]:p,[b]:q``) and then connects to the first that answers, moving on to
the next when it fails (its ``pick_first`` policy). So a list of endpoints becomes one such target; names in it are
resolved once, when the client is made, because a static list holds addresses only. One endpoint stays as given,
and gRPC resolves its name itself. Watches and leases broken by a failover are taken up again by their owners,
as after an etcd restart.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc


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


def open_etcd(
    endpoints: Sequence[tuple[str, int]],
    *,
    timeout: int,
    tls: EtcdTls | None = None,
    user: str | None = None,
    password: str | None = None,
) -> Any:
    """An (unconnected) etcd client over ``endpoints``: call ``connect()`` on it. With ``tls``, the gRPC channel
    is TLS, verified against ``tls.ca`` (and presenting ``tls.cert`` when given); ``user``/``password``
    authenticate to etcd (its token then goes with every request)."""
    import aetcd  # here, not at the top: the CLI imports this module and starts faster without the client

    host, port = etcd_target(endpoints)
    if tls is None:
        return aetcd.Client(host=host, port=port, timeout=timeout, username=user, password=password)
    return _tls_client_class()(tls, host=host, port=port, timeout=timeout, username=user, password=password)


@dataclass(frozen=True, slots=True)
class EtcdTls:
    """The PEM contents of the etcd link's TLS files: the CA, and a client certificate and key (or None)."""

    ca: bytes | None
    cert: bytes | None = None
    key: bytes | None = None

    @classmethod
    def from_files(cls, ca: Path | None, cert: Path | None, key: Path | None) -> EtcdTls:
        def read(path: Path | None) -> bytes | None:
            if path is None:
                return None
            try:
                return path.read_bytes()
            except OSError as exc:
                raise EtcdEndpointError(f"etcd TLS file {path} cannot be read ({exc.strerror or exc})") from None

        return cls(read(ca), read(cert), read(key))


def _tls_client_class() -> Any:
    """aetcd's client with a TLS channel: aetcd dials only in clear, so its ``connect`` is redone here with
    ``secure_channel`` (the rest of the client is aetcd's own)."""
    import aetcd
    from aetcd import rpc, watcher

    class TlsClient(aetcd.Client):  # type: ignore[misc]
        _is_connecting: bool

        def __init__(self, tls: EtcdTls, **options: Any) -> None:
            super().__init__(**options)
            self._credentials = grpc.ssl_channel_credentials(tls.ca, tls.key, tls.cert)

        async def connect(self) -> None:
            if self._connected.is_set():
                return
            if self._is_connecting:
                await asyncio.wait_for(self._connected.wait(), self._connect_wait_timeout)
                return
            self._is_connecting = True
            try:
                target = f"{self._host}:{self._port}"
                self.channel = rpc.secure_channel(target, self._credentials, options=self._options.items())
                if self._username is not None and self._password is not None:
                    self.auth_stub = rpc.AuthStub(self.channel)
                    request = rpc.AuthenticateRequest(name=self._username, password=self._password)
                    response = await self.auth_stub.Authenticate(request, timeout=self._timeout)
                    self.metadata = (("token", response.token),)
                self.kvstub = rpc.KVStub(self.channel)
                self.clusterstub = rpc.ClusterStub(self.channel)
                self.leasestub = rpc.LeaseStub(self.channel)
                self.maintenancestub = rpc.MaintenanceStub(self.channel)
                self._watcher = watcher.Watcher(
                    rpc.WatchStub(self.channel), timeout=self._timeout, metadata=self.metadata
                )
                self._connected.set()
            finally:
                self._is_connecting = False

    return TlsClient


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
