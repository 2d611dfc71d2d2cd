"""The access tables name every wire op and gRPC method the servers serve, and the authorization tests have a
sample request for each: an op or method added without a rule fails here (and would be denied to all but brokers
and super users)."""

from __future__ import annotations

from tests.api.access_samples import GRPC_SAMPLES, WIRE_SAMPLES
from tidelog.api.access_table import GRPC_ACCESS, OPEN, WIRE_ACCESS
from tidelog.protocol.frames import Op


def test_every_wire_op_served_has_a_rule_and_a_sample() -> None:
    from tidelog.api.wire.server import ROUTES

    assert set(ROUTES) - set(WIRE_ACCESS) == set(), "ops served with no access rule"
    assert set(ROUTES) - set(WIRE_SAMPLES) == set(), "ops with no sample request in tests.api.access_samples.py"


def test_every_grpc_method_served_has_a_rule_and_a_sample() -> None:
    from tidelog.protocol._gen import api_pb2 as api
    from tidelog.protocol._gen.tidelog.v1 import admin_pb2, append_pb2

    methods = {
        f"/{service.full_name}/{method.name}"
        for descriptor in (api.DESCRIPTOR, append_pb2.DESCRIPTOR, admin_pb2.DESCRIPTOR)
        for service in descriptor.services_by_name.values()
        for method in service.methods
    }
    assert methods - set(GRPC_ACCESS) == set(), "methods served with no access rule"
    assert methods - set(GRPC_SAMPLES) == set(), "methods with no sample request in tests.api.access_samples.py"


def test_only_the_login_ops_are_open() -> None:
    assert {op for op, rule in WIRE_ACCESS.items() if rule is OPEN} == {Op.SASL_START, Op.SASL_FINISH}
