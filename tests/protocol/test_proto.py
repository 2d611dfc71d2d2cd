"""The generated Liftbridge protobuf matches the wire facts that existing clients depend on.

A renumbered field or a lost streaming flag would not fail any tidelog-only test, yet every Liftbridge client would
silently misread messages; these tests pin the facts through the descriptors. When ``../shared/liftbridge-api.md``
is present, every message, enum and RPC is also compared with it.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor

from tidelog.launch.ports import free_port
from tidelog.protocol import gen_proto
from tidelog.protocol._gen import api_pb2, api_pb2_grpc

SPEC = Path(__file__).resolve().parents[3] / "shared" / "liftbridge-api.md"
FILE = api_pb2.DESCRIPTOR

_SCALARS = {
    FieldDescriptor.TYPE_INT64: "int64",
    FieldDescriptor.TYPE_INT32: "int32",
    FieldDescriptor.TYPE_UINT64: "uint64",
    FieldDescriptor.TYPE_BOOL: "bool",
    FieldDescriptor.TYPE_STRING: "string",
    FieldDescriptor.TYPE_BYTES: "bytes",
}
_SPEC_NAMES = {"NullableInt64": "NInt64", "NullableInt32": "NInt32", "NullableBool": "NBool"}


def type_name(fd: FieldDescriptor) -> str:
    """A field's type as the spec writes it: ``int64``, ``NInt32``, ``repeated string``, ``map<string,bytes>``."""
    if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
        key, value = fd.message_type.fields_by_name["key"], fd.message_type.fields_by_name["value"]
        return f"map<{type_name(key)},{type_name(value)}>"
    if fd.message_type is not None:
        base = _SPEC_NAMES.get(fd.message_type.name, fd.message_type.name)
    elif fd.enum_type is not None:
        base = fd.enum_type.name
    else:
        base = _SCALARS[fd.type]
    return f"repeated {base}" if fd.is_repeated else base


def fields(message: Descriptor) -> dict[int, tuple[str, str]]:
    return {fd.number: (fd.name, type_name(fd)) for fd in message.fields}


def enum_values(enum: EnumDescriptor) -> dict[str, int]:
    return {value.name: value.number for value in enum.values}


def message(name: str) -> Descriptor:
    return FILE.message_types_by_name[name]


def test_package_and_service_names() -> None:
    assert FILE.package == "proto"
    assert FILE.services_by_name["API"].full_name == "proto.API"


def test_key_field_numbers() -> None:
    assert fields(message("CreateStreamRequest"))[16] == ("minIsr", "NInt32")
    assert fields(message("CreateStreamRequest"))[17] == ("optimisticConcurrencyControl", "NBool")
    assert fields(message("PublishRequest"))[9] == ("expectedOffset", "int64")
    assert fields(message("PublishRequest"))[5] == ("headers", "map<string,bytes>")
    assert fields(message("Message"))[12] == ("ackPolicy", "AckPolicy")
    assert fields(message("Ack"))[10] == ("ackError", "Error")
    assert fields(message("StreamMetadata"))[4] == ("partitions", "map<int32,PartitionMetadata>")
    assert fields(message("SubscribeRequest"))[11] == ("consumer", "Consumer")
    assert fields(message("Consumer"))[2] == ("groupEpoch", "uint64")
    assert fields(message("PartitionMetadata"))[4] == ("isr", "repeated string")
    for wrapper in ("NullableInt64", "NullableInt32", "NullableBool"):
        assert list(fields(message(wrapper))) == [1]
        assert fields(message(wrapper))[1][0] == "value"
    assert fields(message("CreateStreamResponse")) == {}


def test_enum_values() -> None:
    assert enum_values(FILE.enum_types_by_name["AckPolicy"]) == {"LEADER": 0, "ALL": 1, "NONE": 2}
    assert enum_values(FILE.enum_types_by_name["StartPosition"]) == {
        "NEW_ONLY": 0,
        "OFFSET": 1,
        "EARLIEST": 2,
        "LATEST": 3,
        "TIMESTAMP": 4,
    }
    assert enum_values(message("PublishAsyncError").enum_types_by_name["Code"])["INCORRECT_OFFSET"] == 5
    assert enum_values(message("Ack").enum_types_by_name["Error"]) == {
        "OK": 0,
        "UNKNOWN": 1,
        "INCORRECT_OFFSET": 2,
        "TOO_LARGE": 3,
        "ENCRYPTION": 4,
    }
    assert enum_values(message("StreamMetadata").enum_types_by_name["Error"]) == {"OK": 0, "UNKNOWN_STREAM": 1}
    assert enum_values(message("ConsumerGroupMetadata").enum_types_by_name["Error"]) == {"OK": 0, "UNKNOWN_GROUP": 1}
    # Nested enums are reachable the way handlers will use them.
    assert api_pb2.Ack.Error.INCORRECT_OFFSET == 2
    assert api_pb2.PublishAsyncError.Code.PERMISSION_DENIED == 7


def test_service_has_all_rpcs_with_streaming_flags() -> None:
    methods = FILE.services_by_name["API"].methods_by_name
    assert len(methods) == 16
    streaming = {name: (m.client_streaming, m.server_streaming) for name, m in methods.items()}
    assert streaming.pop("Subscribe") == (False, True)
    assert streaming.pop("PublishAsync") == (True, True)
    assert set(streaming.values()) == {(False, False)}
    assert set(streaming) == {
        "CreateStream",
        "DeleteStream",
        "PauseStream",
        "SetStreamReadonly",
        "FetchMetadata",
        "FetchPartitionMetadata",
        "Publish",
        "PublishToSubject",
        "SetCursor",
        "FetchCursor",
        "JoinConsumerGroup",
        "LeaveConsumerGroup",
        "FetchConsumerGroupAssignments",
        "ReportConsumerGroupCoordinator",
    }
    assert methods["Subscribe"].output_type.name == "Message"
    assert methods["PublishAsync"].input_type.name == "PublishRequest"


def test_round_trip_keeps_headers_and_wrappers() -> None:
    request = api_pb2.PublishRequest(
        key=b"k", value=b"v", stream="s", headers={"h": b"\x00\x01"}, ackPolicy=api_pb2.ALL, expectedOffset=-1
    )
    assert api_pb2.PublishRequest.FromString(request.SerializeToString()) == request
    create = api_pb2.CreateStreamRequest(name="s", minIsr=api_pb2.NullableInt32(value=0))
    decoded = api_pb2.CreateStreamRequest.FromString(create.SerializeToString())
    assert decoded.HasField("minIsr")  # an explicit 0 is not "use the default"
    assert not decoded.HasField("segmentMaxBytes")


def test_generated_files_are_up_to_date() -> None:
    assert gen_proto.stale_files() == [], "run: python -m tidelog.protocol.gen_proto"


class _Servicer(api_pb2_grpc.APIServicer):
    async def FetchCursor(
        self, request: api_pb2.FetchCursorRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.FetchCursorResponse:
        return api_pb2.FetchCursorResponse(offset=len(request.cursorId))

    async def PublishAsync(
        self, request_iterator: AsyncIterator[api_pb2.PublishRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[api_pb2.PublishResponse]:
        async for request in request_iterator:
            yield api_pb2.PublishResponse(correlationId=request.correlationId)


async def test_grpc_module_serves_unary_and_bidi_calls() -> None:
    server = grpc.aio.server()
    api_pb2_grpc.add_APIServicer_to_server(_Servicer(), server)
    port = server.add_insecure_port(f"127.0.0.1:{free_port()}")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = api_pb2_grpc.APIStub(channel)
            reply = await stub.FetchCursor(api_pb2.FetchCursorRequest(cursorId="abc"), timeout=10)
            assert reply.offset == 3
            call = stub.PublishAsync(iter([api_pb2.PublishRequest(correlationId=str(i)) for i in range(3)]), timeout=10)
            assert [response.correlationId async for response in call] == ["0", "1", "2"]
    finally:
        await server.stop(grace=None)


# ---- the whole specification, when it is available ----


def _spec_text() -> str:
    if not SPEC.is_file():
        pytest.skip(f"{SPEC} not present")
    return SPEC.read_text(encoding="utf-8")


def test_every_message_matches_the_spec() -> None:
    spec: dict[str, dict[int, tuple[str, str]]] = {}
    for name, empty, body in re.findall(r"### message `(\w+)`(: no fields)?\n(.*)", _spec_text()):
        entries = [] if empty else re.findall(r"(\d+):(\w+)\(([^)]*)\)", body)
        spec[name] = {int(number): (field, kind) for number, field, kind in entries}
    assert set(spec) == set(FILE.message_types_by_name)
    for name, expected in spec.items():
        assert fields(message(name)) == expected, name


def test_every_enum_matches_the_spec() -> None:
    for name, values in re.findall(r"### enum `([\w.]+)`: (.*)", _spec_text()):
        expected = {value.split("=")[0]: int(value.split("=")[1]) for value in values.split(", ")}
        if "." in name:
            parent, child = name.split(".")
            enum = message(parent).enum_types_by_name[child]
        else:
            enum = FILE.enum_types_by_name[name]
        assert enum_values(enum) == expected, name


def test_every_rpc_matches_the_spec() -> None:
    rows = re.findall(r"^\| (\w+) \| (stream )?(\w+) \| (stream )?(\w+) \|$", _spec_text(), re.MULTILINE)[1:]  # header
    methods = FILE.services_by_name["API"].methods_by_name
    assert {row[0] for row in rows} == set(methods)
    for rpc, client_stream, request, server_stream, response in rows:
        method = methods[rpc]
        assert (method.input_type.name, method.output_type.name) == (request, response), rpc
        assert (method.client_streaming, method.server_streaming) == (bool(client_stream), bool(server_stream)), rpc
