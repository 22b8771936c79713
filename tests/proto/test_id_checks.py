"""The id checks' fast paths (a regular expression before the precise check) accept
exactly what the precise checks accept: canonical lower-case UUIDs for transaction ids,
1 to 63 ASCII letters, digits, '-', '_' or '.' for node ids."""

from __future__ import annotations

import uuid

from hypothesis import example, given
from hypothesis import strategies as st

from txsync.codec import NODE_ID_CHARS_MAX, WireError, check_node_id
from txsync.ids import tx_id_problem

_UUID_ALPHABET = "0123456789abcdefABCDEF-{}urn:x"


def _is_canonical_uuid(text: str) -> bool:
    """The definition the fast path stands in for."""
    try:
        return str(uuid.UUID(text)) == text
    except ValueError:
        return False


_TX_ID_LIKE = st.one_of(
    st.uuids().map(str),
    st.uuids().map(lambda u: str(u).upper()),
    st.uuids().map(lambda u: u.hex),
    st.text(_UUID_ALPHABET, max_size=45),
)


@given(_TX_ID_LIKE)
@example("{12345678-1234-5678-1234-567812345678}")
@example("urn:uuid:12345678-1234-5678-1234-567812345678")
@example("12345678-1234-5678-1234-56781234567\n")
def test_a_tx_id_is_accepted_exactly_when_it_is_a_canonical_uuid(text: str) -> None:
    assert (tx_id_problem(text, "tx_id") is None) == _is_canonical_uuid(text)


def _is_node_id(text: str) -> bool:
    return 0 < len(text) <= NODE_ID_CHARS_MAX and all(
        ch.isascii() and (ch.isalnum() or ch in "-_.") for ch in text
    )


@given(st.text(st.characters(codec="utf-8"), max_size=70))
@example("dc1")
@example("d" * 64)
@example("dc1\n")
@example("dc\u0661")  # ARABIC-INDIC DIGIT ONE: a digit, but not ASCII
def test_a_node_id_is_accepted_exactly_by_its_rule(text: str) -> None:
    try:
        check_node_id(text, "node_id")
    except WireError:
        accepted = False
    else:
        accepted = True
    assert accepted == _is_node_id(text)
