"""Who may read the HTTP port (``/metrics`` and the web cluster view) when authorization is on.

Both show every stream, partition, group and broker of the cluster, so they need what listing every stream needs
over the other protocols: ``describe`` on ``cluster`` (super users and brokers pass, as everywhere). ``/healthz``,
``/readyz`` and the view's static files stay open: they say only whether the broker serves, and a load balancer or
an orchestrator asks them without credentials.

The principal is the one the other listeners would give the same client: its verified certificate
(:class:`~tidelog.api.principals.PrincipalResolver`; the HTTP port asks for client certificates as the wire port
does), or, for a client without one, a user name and password in ``authorization: Basic`` (what browsers prompt
for, and Prometheus's ``basic_auth``), checked against the SCRAM users (:mod:`tidelog.api.password_check`).
Authorization needs TLS, so this header never crosses the network in clear.

An anonymous client refused is answered 401 with a ``WWW-Authenticate: Basic`` challenge (a browser then asks
for a user name and password), bad credentials 401, a known principal the ACLs refuse 403; each body is the one
line the other protocols would give. Refusals are counted in ``tidelog_authz_denied_total{protocol="http"}``
under ``metrics`` or ``web view``.
"""

from __future__ import annotations

from cryptography import x509

from tidelog.api.access_table import Access
from tidelog.api.authorizer import Authorizer
from tidelog.api.password_check import LoginFailed, PasswordCheck
from tidelog.api.principals import Principal, PrincipalResolver
from tidelog.api.rpc.call_principal import CallRefused, user_and_password
from tidelog.metadata.acl_records import CLUSTER_NAME, Operation, ResourceType
from tidelog.protocol.errors import PermissionDeniedError

__all__ = ["OPEN_PATHS", "HttpAccess"]

OPEN_PATHS = ("/healthz", "/readyz")
"""Paths anyone may ask (and ``/static/...``)."""
_NEEDS = (Access(ResourceType.CLUSTER, CLUSTER_NAME, Operation.DESCRIBE),)


class HttpAccess:
    """The HTTP port's check (module docstring): ``await access(client_pem, authorization, path)`` is None when
    the request may go on, else the HTTP status (401 or 403) and the one-line reason."""

    def __init__(
        self, authorizer: Authorizer, certificates: PrincipalResolver, passwords: PasswordCheck | None
    ) -> None:
        self._authorizer = authorizer
        self._certificates = certificates
        self._passwords = passwords

    async def __call__(self, client_pem: str | None, authorization: str | None, path: str) -> tuple[int, str] | None:
        if path in OPEN_PATHS or path.startswith("/static/"):
            return None
        try:
            principal = await self._principal(client_pem, authorization)
        except CallRefused as exc:
            return 401, str(exc)
        what = "metrics" if path == "/metrics" else "web view"
        try:
            self._authorizer.check(principal, lambda _request: _NEEDS, None, "http", what)
        except PermissionDeniedError as exc:
            return (401 if principal.anonymous else 403), exc.message
        return None

    async def _principal(self, client_pem: str | None, authorization: str | None) -> Principal:
        certificate = x509.load_pem_x509_certificate(client_pem.encode()) if client_pem else None
        principal = self._certificates.of_certificate(certificate)
        if authorization is None:
            return principal
        user, password = user_and_password(authorization)
        if not principal.anonymous:
            raise CallRefused(
                f"this connection is already the principal {principal} (its certificate): send a password only "
                "without a client certificate"
            )
        if self._passwords is None:
            raise CallRefused("this broker has no user store for password logins")
        try:
            return await self._passwords.principal(user, password)
        except LoginFailed as exc:
            raise CallRefused(str(exc)) from None
