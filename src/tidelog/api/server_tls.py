"""A broker's listener certificates: loaded from files, reloaded when the files change, served to both listeners.

:class:`ServerTls` holds what the gRPC API and the wire protocol present and check: ``tls_cert``/``tls_key``, and
client certificates by ``tls_client_auth`` verified against ``tls_client_ca``. Both listeners take it from here,
so they never disagree on a certificate.

**Rotation without a restart.** One watcher task (:meth:`ServerTls.start`) looks at the files' size, mtime and
inode every ``poll_interval`` seconds. When any changed, it builds a new context from them; connections made from
then on get it, and open connections keep the one they shook hands with (as every TLS server does: the
certificate is checked once per handshake). New files that cannot be used — a key written before its certificate,
a half-written file — are logged and the previous certificate stays in use; the next change is tried again, so
writing the two files one after the other is safe. How each listener takes the new one:

- the wire server asks :meth:`ServerTls.context` for every connection it accepts (it starts TLS itself on the
  accepted socket, :mod:`tidelog.api.wire.server`);
- gRPC calls the fetcher of :meth:`ServerTls.grpc_credentials` before each handshake (gRPC's dynamic server
  credentials), which hands over the new files' contents once per change.

gRPC knows two modes where the wire protocol knows three: ``optional`` asks wire clients for a certificate and
lets them in without one, while gRPC cannot ask without requiring, so under ``optional`` gRPC does not ask (its
clients are anonymous at the TLS level).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
from pathlib import Path
from typing import Any

import grpc

from tidelog.protocol.tls import ClientAuth, TlsConfigError, server_context

log = logging.getLogger(__name__)

_Stamp = tuple[tuple[int, int, int] | None, ...]


class ServerTls:
    """The current listener context and the files it came from; :meth:`start` watches them for changes."""

    def __init__(
        self,
        cert: Path,
        key: Path,
        *,
        client_ca: Path | None = None,
        client_auth: ClientAuth = ClientAuth.NONE,
        poll_interval: float = 1.0,
    ) -> None:
        """Loads the files now: :class:`~tidelog.protocol.tls.TlsConfigError` when they cannot be used."""
        self.cert = cert
        self.key = key
        self.client_ca = client_ca
        self.client_auth = client_auth
        self.poll_interval = poll_interval
        self._stamp = self._stamp_now()
        self._context, self._pem = self._load()
        self.generation = 1  # one more for every reload that took effect
        self._watcher: asyncio.Task[None] | None = None
        self._reloaded = asyncio.Event()  # set (and replaced) at every reload that took effect

    # ---- what the listeners use ----

    def context(self) -> ssl.SSLContext:
        """The context for a connection accepted now."""
        return self._context

    def grpc_credentials(self) -> grpc.ServerCredentials:
        """gRPC server credentials that follow every reload (checked before each handshake)."""
        served = [self.generation]

        def fetch() -> Any:  # runs on a gRPC thread: it reads two attributes, replaced whole by the loop
            generation, pem = self.generation, self._pem
            if generation == served[0]:
                return None  # unchanged: keep the current configuration
            served[0] = generation
            return self._grpc_config(pem)

        return grpc.dynamic_ssl_server_credentials(
            self._grpc_config(self._pem),
            fetch,
            require_client_authentication=self.client_auth is ClientAuth.REQUIRED,
        )

    def _grpc_config(self, pem: tuple[bytes, bytes, bytes | None]) -> Any:
        key, cert, ca = pem
        return grpc.ssl_server_certificate_configuration(
            [(key, cert)], root_certificates=ca if self.client_auth is ClientAuth.REQUIRED else None
        )

    # ---- reloading ----

    def reload_if_changed(self) -> bool:
        """Load the files again if they changed since the last look; whether a new certificate took effect."""
        stamp = self._stamp_now()
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            context, pem = self._load()
        except TlsConfigError as exc:
            log.warning("TLS files changed but cannot be used (%s); still serving the previous certificate", exc)
            return False
        self._context, self._pem = context, pem
        self.generation += 1
        self._reloaded.set()
        self._reloaded = asyncio.Event()
        log.info("TLS certificate reloaded from %s (new connections use it)", self.cert)
        return True

    async def wait_generation(self, generation: int) -> None:
        """Return once the certificate generation ``generation`` is in use (1 is the first, each reload adds 1)."""
        while self.generation < generation:
            await self._reloaded.wait()

    def start(self) -> None:
        """Start the watcher task (one per broker, whatever the number of connections)."""
        if self._watcher is None:
            self._watcher = asyncio.get_running_loop().create_task(self._watch(), name="tls-reload")

    async def stop(self) -> None:
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval)
            try:
                self.reload_if_changed()
            except Exception:  # the watcher must outlive any surprise: the current certificate stays
                log.exception("TLS reload check failed")

    def _load(self) -> tuple[ssl.SSLContext, tuple[bytes, bytes, bytes | None]]:
        context = server_context(self.cert, self.key, client_ca=self.client_ca, client_auth=self.client_auth)
        try:
            pem = (
                self.key.read_bytes(),
                self.cert.read_bytes(),
                self.client_ca.read_bytes() if self.client_ca is not None else None,
            )
        except OSError as exc:
            raise TlsConfigError(f"TLS files cannot be read: {exc}") from None
        return context, pem

    def _stamp_now(self) -> _Stamp:
        return tuple(_stat(path) for path in (self.cert, self.key, self.client_ca))


def _stat(path: Path | None) -> tuple[int, int, int] | None:
    if path is None:
        return None
    try:
        found = os.stat(path)
    except OSError:
        return None
    return (found.st_mtime_ns, found.st_size, found.st_ino)
