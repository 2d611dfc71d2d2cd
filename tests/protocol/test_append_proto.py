"""The ``tidelog.v1`` Append protobuf pins the facts that clients in other languages depend on.

Numbers, names and presence are the API: a renumbered field or a Status that drifted from tidelog's error codes
would not fail a Python test that builds messages by name, yet every client generated from the ``.proto`` would
misread the broker. These tests read them from the descriptors.
"""

from __future__ import annotations

from google.protobuf.descriptor import FieldDescriptor

from tidelog.protocol._gen.tidelog.v1 import append_pb2 as pb
from tidelog.protocol.errors import ErrorCode

FILE = pb.DESCRIPTOR


def test_file_package_and_service() -> None:
    assert FILE.name == "tidelog/v1/append.proto" and FILE.package == "tidelog.v1"
    method = FILE.services_by_name["Appender"].methods_by_name["Append"]
    assert method.full_name == "tidelog.v1.Appender.Append"
    assert (method.client_streaming, method.server_streaming) == (True, False)
    assert (method.input_type.name, method.output_type.name) == ("AppendRequest", "AppendResponse")


def test_status_is_the_error_code_table() -> None:
    """Every ErrorCode is a Status of the same number (the broker sends ErrorCode numbers as Status), and no
    Status stands for a code tidelog does not have."""
    statuses = {value.name: value.number for value in FILE.enum_types_by_name["Status"].values}
    assert statuses.pop("STATUS_OK") == 0
    assert statuses == {f"STATUS_{code.name}": int(code) for code in ErrorCode}


def test_field_numbers() -> None:
    def fields(message: str) -> dict[int, str]:
        return {field.number: field.name for field in FILE.message_types_by_name[message].fields}

    assert fields("AppendRequest") == {1: "header", 2: "records", 3: "commit"}
    assert fields("AppendHeader") == {
        1: "stream",
        2: "partition",
        3: "expected_offset",
        4: "check_registers",
        5: "union_registers",
        6: "subtract_registers",
        7: "acks",
        8: "timeout_ms",
    }
    assert fields("Record") == {1: "key", 2: "value", 3: "headers", 4: "timestamp"}
    assert fields("AppendResponse") == {
        1: "status",
        2: "message",
        3: "base_offset",
        4: "last_offset",
        5: "log_end",
        6: "registers",
    }
    assert fields("Label") == {1: "name", 2: "value"}
    assert fields("LabelSelector") == {1: "include", 2: "exclude"}
    acks = {value.name: value.number for value in FILE.enum_types_by_name["Acks"].values}
    assert acks == {"ACKS_UNSPECIFIED": 0, "ACKS_LEADER": 1, "ACKS_ALL": 2}


def test_absent_is_not_zero_where_it_matters() -> None:
    """An expected offset of 0 (an empty log), an empty key and an empty value are not their absence."""
    presence = {
        (message, field): FILE.message_types_by_name[message].fields_by_name[field].has_presence
        for message, field in (("AppendHeader", "expected_offset"), ("Record", "key"), ("Record", "value"))
    }
    assert all(presence.values()), presence
    decoded = pb.AppendHeader.FromString(pb.AppendHeader(expected_offset=0).SerializeToString())
    assert decoded.HasField("expected_offset") and not pb.AppendHeader().HasField("expected_offset")
    record = pb.Record.FromString(pb.Record(key=b"", value=b"").SerializeToString())
    assert record.HasField("key") and record.HasField("value")
    field = FILE.message_types_by_name["AppendHeader"].fields_by_name["expected_offset"]
    assert field.type == FieldDescriptor.TYPE_INT64
