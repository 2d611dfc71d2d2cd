"""The authorization decision, made at the edge before a request does anything.

:class:`Authorizer` answers whether a :class:`~tidelog.api.principals.Principal` may have each
:class:`~tidelog.api.access_table.Access` a request needs, from the ACL entries this broker's
:class:`~tidelog.metadata.acl_mirror.AclMirror` follows in etcd:

1. a super user (the ``super_users`` setting) or a broker principal may do everything;
2. while an ACL record does not decode, everyone else is denied (fail closed);
3. otherwise the entries covering the principal (by name or ``*``), the resource type, the name (literal, ``*``
   or prefix) and the operation (or ``all``; ``read``, ``write``, ``delete`` and ``alter`` allow ``describe``)
   decide: a deny wins over any allow, and no entry at all is a deny.

A refusal is :class:`~tidelog.protocol.errors.PermissionDeniedError` naming the principal, the operation and the
resource — PERMISSION_DENIED on both protocols — counted in ``tidelog_authz_denied_total`` and logged at most
once per :data:`LOG_EVERY` seconds for the same principal and access (a client retrying in a loop does not flood
the log). Decisions are cached until the ACLs change.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Protocol

from tidelog import telemetry
from tidelog.api.access_table import BROKERS_ONLY, OPEN, Access, Rule
from tidelog.api.principals import Principal
from tidelog.metadata.acl_records import AclEntry, Permission
from tidelog.protocol.errors import PermissionDeniedError

log = logging.getLogger(__name__)

LOG_EVERY = 10.0
"""Seconds between two log lines about the same principal denied the same access."""
_CACHE_MAX = 16_384


class AclSource(Protocol):
    """What the authorizer reads: the mirror's entries, its undecodable records, and a change counter."""

    @property
    def entries(self) -> Mapping[bytes, AclEntry]: ...

    @property
    def broken(self) -> frozenset[bytes]: ...

    generation: int


class Authorizer:
    """Checks principals against the ACLs (module docstring)."""

    def __init__(self, acls: AclSource, super_users: Iterable[str] = ()) -> None:
        self._acls = acls
        self.super_users = frozenset(super_users)
        self._cache: dict[tuple[str, Access], str | None] = {}
        self._cache_generation = -1
        self._logged: dict[tuple[str, str], float] = {}

    # ---- the decision ----

    def refusal(self, principal: Principal, access: Access) -> str | None:
        """Why ``principal`` may not have ``access`` (None: it may)."""
        if principal.broker or (principal.name and principal.name in self.super_users):
            return None
        if self._acls.generation != self._cache_generation:
            self._cache.clear()
            self._cache_generation = self._acls.generation
        key = (principal.name, access)
        try:
            return self._cache[key]
        except KeyError:
            pass
        reason = self._decide(principal.name, access)
        if len(self._cache) >= _CACHE_MAX:
            self._cache.clear()
        self._cache[key] = reason
        return reason

    def _decide(self, name: str, access: Access) -> str | None:
        broken = self._acls.broken
        if broken:
            return f"{len(broken)} ACL record(s) do not decode, so only super users are allowed"
        allowed = False
        for entry in self._acls.entries.values():
            if (
                entry.resource is access.resource
                and (entry.principal == "*" or (name and entry.principal == name))
                and entry.covers_name(access.name)
                and entry.covers_operation(access.operation)
            ):
                if entry.permission is Permission.DENY:
                    return "an ACL entry denies it"
                allowed = True
        return None if allowed else "no ACL entry allows it"

    # ---- at the edge ----

    def check(self, principal: Principal, rule: Rule, request: object, protocol: str, what: str) -> None:
        """Raise PermissionDeniedError unless ``principal`` may make ``request`` (of op or method ``what``)."""
        if rule is OPEN:
            return
        if rule is BROKERS_ONLY:
            if principal.broker or (principal.name and principal.name in self.super_users):
                return
            self._deny(principal, protocol, what, f"{what} (a broker-to-broker operation)", "only brokers may")
            return
        assert callable(rule)
        for access in rule(request):
            reason = self.refusal(principal, access)
            if reason is not None:
                self._deny(principal, protocol, what, str(access), reason)

    def check_unknown(self, principal: Principal, protocol: str, what: str) -> None:
        """A request no table entry describes: denied (only brokers and super users pass)."""
        self.check(principal, BROKERS_ONLY, None, protocol, what)

    def _deny(self, principal: Principal, protocol: str, what: str, access: str, reason: str) -> None:
        telemetry.authz_denied(protocol, what)
        message = f"principal {principal} may not {access}: {reason}"
        now = time.monotonic()
        key = (principal.name, access)
        last = self._logged.get(key)
        if last is None or now - last >= LOG_EVERY:
            if len(self._logged) >= _CACHE_MAX:
                self._logged.clear()
            self._logged[key] = now
            log.warning("denied %s %s: %s", protocol, what, message)
        raise PermissionDeniedError(message)
