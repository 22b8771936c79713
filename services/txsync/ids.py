"""Identifier rules shared by every service (the pure core stays free of ``uuid``)."""

from __future__ import annotations

import re
import uuid

from txsync.protocol import GENESIS_TX_ID

_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
"""Exactly the strings ``str(uuid.UUID(...))`` produces. Checked first: ids are checked
on every message of every hot path, and parsing each as a UUID cost more than the rest
of decoding a meta."""


def tx_id_problem(tx_id: str, field: str) -> str | None:
    """Why ``tx_id`` is not a canonical lower-case UUID, or None if it is one."""
    if _CANONICAL_UUID.fullmatch(tx_id):
        return None
    try:
        parsed = uuid.UUID(tx_id)
    except ValueError:
        return f"{field}: {tx_id[:64]!r} is not a UUID"
    if str(parsed) != tx_id:
        return f"{field}: {tx_id[:64]!r} is not a canonical lower-case UUID"
    return None


def is_genesis(tx_id: str) -> bool:
    return tx_id == GENESIS_TX_ID
