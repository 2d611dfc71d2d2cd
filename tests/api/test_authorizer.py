"""The ACL decision: deny wins, nothing matching is a deny, patterns, implied describe, super users and brokers,
undecodable records failing closed; refusals name the principal, the operation and the resource, and the log is
rate-limited."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import pytest

from tidelog.api.access_table import BROKERS_ONLY, OPEN, WIRE_ACCESS, Access
from tidelog.api.authorizer import Authorizer
from tidelog.api.principals import ANONYMOUS, Principal
from tidelog.metadata.acl_records import (
    CLUSTER_NAME,
    AclEntry,
    Operation,
    Pattern,
    Permission,
    ResourceType,
)
from tidelog.protocol.errors import PermissionDeniedError
from tidelog.protocol.frames import Op
from tidelog.protocol.messages import ProduceRequest

STREAM, GROUP, CLUSTER = ResourceType.STREAM, ResourceType.GROUP, ResourceType.CLUSTER
ALLOW, DENY = Permission.ALLOW, Permission.DENY
ALICE = Principal("alice")


class Acls:
    """A stand-in for the mirror: entries, undecodable keys and the change counter."""

    def __init__(self, *entries: AclEntry) -> None:
        self._entries = {str(i).encode(): e for i, e in enumerate(entries)}
        self.broken: frozenset[bytes] = frozenset()
        self.generation = 0

    @property
    def entries(self) -> Mapping[bytes, AclEntry]:
        return self._entries

    def set(self, *entries: AclEntry) -> None:
        self._entries = {str(i).encode(): e for i, e in enumerate(entries)}
        self.generation += 1


def acl(principal: str, resource: ResourceType, name: str, operation: Operation, permission: Permission,
        pattern: Pattern = Pattern.LITERAL) -> AclEntry:  # fmt: skip
    return AclEntry(principal, resource, name, operation, permission, pattern)


def allowed(authorizer: Authorizer, principal: Principal, resource: ResourceType, name: str, op: Operation) -> bool:
    return authorizer.refusal(principal, Access(resource, name, op)) is None


def test_nothing_matching_is_a_deny() -> None:
    authorizer = Authorizer(Acls())
    assert authorizer.refusal(ALICE, Access(STREAM, "orders", Operation.READ)) == "no ACL entry allows it"


def test_deny_wins_over_allow() -> None:
    authorizer = Authorizer(
        Acls(
            acl("*", STREAM, "orders", Operation.ALL, ALLOW),
            acl("alice", STREAM, "ord", Operation.WRITE, DENY, Pattern.PREFIXED),
        )
    )
    assert allowed(authorizer, ALICE, STREAM, "orders", Operation.READ)
    assert not allowed(authorizer, ALICE, STREAM, "orders", Operation.WRITE)
    assert allowed(authorizer, Principal("bob"), STREAM, "orders", Operation.WRITE)


def test_patterns_and_wildcards() -> None:
    authorizer = Authorizer(
        Acls(
            acl("alice", STREAM, "logs.", Operation.READ, ALLOW, Pattern.PREFIXED),
            acl("alice", GROUP, "*", Operation.READ, ALLOW),
            acl("*", CLUSTER, CLUSTER_NAME, Operation.DESCRIBE, ALLOW),
        )
    )
    assert allowed(authorizer, ALICE, STREAM, "logs.web", Operation.READ)
    assert not allowed(authorizer, ALICE, STREAM, "logsweb", Operation.READ)
    assert not allowed(authorizer, ALICE, STREAM, "logs.web", Operation.WRITE)
    assert allowed(authorizer, ALICE, GROUP, "any-group", Operation.READ)
    assert not allowed(authorizer, ALICE, STREAM, "*x", Operation.DESCRIBE)  # * is a wildcard only as the name
    assert allowed(authorizer, ANONYMOUS, CLUSTER, CLUSTER_NAME, Operation.DESCRIBE)  # * covers anonymous
    assert not allowed(authorizer, ANONYMOUS, GROUP, "g", Operation.READ)  # and nothing names it otherwise


def test_read_write_delete_alter_imply_describe_but_a_deny_does_not_spread() -> None:
    authorizer = Authorizer(
        Acls(
            acl("alice", STREAM, "orders", Operation.WRITE, ALLOW),
            acl("bob", STREAM, "orders", Operation.DESCRIBE, ALLOW),
            acl("bob", STREAM, "orders", Operation.WRITE, DENY),
        )
    )
    assert allowed(authorizer, ALICE, STREAM, "orders", Operation.DESCRIBE)
    assert not allowed(authorizer, ALICE, STREAM, "orders", Operation.CREATE)
    assert allowed(authorizer, Principal("bob"), STREAM, "orders", Operation.DESCRIBE)


def test_super_users_and_brokers_pass_even_while_a_record_does_not_decode() -> None:
    acls = Acls(acl("alice", STREAM, "orders", Operation.ALL, ALLOW))
    authorizer = Authorizer(acls, super_users=("admin",))
    assert allowed(authorizer, ALICE, STREAM, "orders", Operation.READ)
    acls.broken = frozenset({b"/tidelog/acls/bad"})
    acls.generation += 1
    reason = authorizer.refusal(ALICE, Access(STREAM, "orders", Operation.READ))
    assert reason is not None and "do not decode" in reason
    assert allowed(authorizer, Principal("admin"), STREAM, "orders", Operation.DELETE)
    assert allowed(authorizer, Principal("b1", broker=True), STREAM, "orders", Operation.DELETE)


def test_a_change_is_seen_at_once_despite_the_cache() -> None:
    acls = Acls()
    authorizer = Authorizer(acls)
    assert not allowed(authorizer, ALICE, STREAM, "orders", Operation.READ)
    acls.set(acl("alice", STREAM, "orders", Operation.READ, ALLOW))
    assert allowed(authorizer, ALICE, STREAM, "orders", Operation.READ)
    acls.set()
    assert not allowed(authorizer, ALICE, STREAM, "orders", Operation.READ)


def test_broker_only_ops_refuse_every_acl() -> None:
    authorizer = Authorizer(Acls(*(acl("carol", r, n, Operation.ALL, ALLOW) for r, n in (
        (STREAM, "*"), (GROUP, "*"), (CLUSTER, CLUSTER_NAME)))), super_users=("admin",))  # fmt: skip
    assert WIRE_ACCESS[Op.REPLICA_FETCH] is BROKERS_ONLY
    with pytest.raises(PermissionDeniedError, match="principal carol may not REPLICA_FETCH"):
        authorizer.check(Principal("carol"), BROKERS_ONLY, None, "wire", "REPLICA_FETCH")
    authorizer.check(Principal("b1", broker=True), BROKERS_ONLY, None, "wire", "REPLICA_FETCH")
    authorizer.check(Principal("admin"), BROKERS_ONLY, None, "wire", "REPLICA_FETCH")
    authorizer.check(ANONYMOUS, OPEN, None, "grpc", "Check")


def test_a_refusal_names_principal_operation_and_resource_and_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    authorizer = Authorizer(Acls())
    rule = WIRE_ACCESS[Op.PRODUCE]
    with caplog.at_level(logging.WARNING, logger="tidelog.api.authorizer"):
        for _ in range(3):
            with pytest.raises(PermissionDeniedError) as refused:
                authorizer.check(ALICE, rule, ProduceRequest("orders", 0), "wire", "PRODUCE")
    assert refused.value.message == "principal alice may not write stream 'orders': no ACL entry allows it"
    assert len([r for r in caplog.records if "may not write stream 'orders'" in r.getMessage()]) == 1
