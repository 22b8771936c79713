"""The state digest's encoding is our own and pinned (issue 18): DCs running different
protobuf releases must compute the same bytes, so these constants change only with a
deliberate, documented change of the encoding (worker/outcomes.py)."""

from __future__ import annotations

import pytest

from txsync.v1 import common_pb2
from txsync.worker.outcomes import GENESIS_DIGEST, encode_statement, next_digest
from txsync.worker.transactions import Transaction, statement_from_proto

PROTO_STATEMENT = common_pb2.Statement(
    sql="INSERT INTO t VALUES (?, ?, ?, ?, ?, ?)",
    params=[
        common_pb2.SqlValue(int_value=-2),
        common_pb2.SqlValue(real_value=1.5),
        common_pb2.SqlValue(text_value="é"),
        common_pb2.SqlValue(blob_value=b"\x00\xff"),
        common_pb2.SqlValue(bool_value=True),
        common_pb2.SqlValue(),
    ],
)
STATEMENT = statement_from_proto(PROTO_STATEMENT)
"""As a worker receives it: converted once at the service's edge."""


def test_a_statement_encodes_to_these_bytes() -> None:
    assert encode_statement(STATEMENT) == (
        b"\x00\x00\x00\x27INSERT INTO t VALUES (?, ?, ?, ?, ?, ?)"
        b"\x00\x00\x00\x06"
        b"I\xff\xff\xff\xff\xff\xff\xff\xfe"
        b"R\x3f\xf8\x00\x00\x00\x00\x00\x00"
        b"T\x00\x00\x00\x02\xc3\xa9"
        b"B\x00\x00\x00\x02\x00\xff"
        b"O\x01"
        b"N"
    )


def test_the_digest_of_a_history_step_is_pinned() -> None:
    body = Transaction((STATEMENT,))
    digest = next_digest(GENESIS_DIGEST, 7, "tx-7", body, ok=True, rows_affected=(1,))
    assert digest.hex() == PINNED
    content = next_digest(GENESIS_DIGEST, 7, "tx-7", body, ok=True, rows_affected=(1,),
                          content=b"\x01" * 32)  # fmt: skip
    assert content != digest


def test_every_kind_of_value_has_an_encoding() -> None:
    kinds = {field.name for field in common_pb2.SqlValue.DESCRIPTOR.oneofs_by_name["value"].fields}
    encodings = set()
    for kind in kinds:
        value = common_pb2.SqlValue()
        field = common_pb2.SqlValue.DESCRIPTOR.fields_by_name[kind]
        default = {
            field.TYPE_STRING: "x", field.TYPE_BYTES: b"x", field.TYPE_BOOL: True,
            field.TYPE_DOUBLE: 1.0,
        }.get(field.type, 1)  # fmt: skip
        setattr(value, kind, default)
        statement = statement_from_proto(common_pb2.Statement(sql="?", params=[value]))
        encodings.add(encode_statement(statement))
    assert len(encodings) == len(kinds)  # every kind its own encoding (a bool is no int)


@pytest.fixture(autouse=True)
def _no_protobuf_in_the_digest(monkeypatch: pytest.MonkeyPatch) -> None:
    """The digest must not depend on protobuf's serialization of statements."""

    def refuse(*_: object, **__: object) -> bytes:
        raise AssertionError("the digest serialized a protobuf message")

    monkeypatch.setattr(common_pb2.Statement, "SerializeToString", refuse)


PINNED = "5ea433e2943c7dfeef12c7928e48d3e0138ac550beb506247a73325c8c10e2be"
