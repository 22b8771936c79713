"""Checks on client and internal requests: each names the field and the limit it broke.

The limits are the ones stated in ``proto/txsync/v1/*.proto``; a request that breaks one
is refused as ``Refused.INVALID`` (INVALID_ARGUMENT at the gRPC edge) and changes nothing.
"""

from __future__ import annotations

import re

from google.protobuf.message import DecodeError

from txsync.codec import WEIGHT_MAX, WireError, check_node_id, check_url
from txsync.ids import tx_id_problem
from txsync.protocol import TxState
from txsync.protocol.limits import INCOMING_TXS_MOST
from txsync.refusals import Refusal, Refused
from txsync.telemetry import work
from txsync.transaction_store.txlog.bodies import body_digest
from txsync.v1 import common_pb2

STATEMENTS_MAX = 1_000
SQL_BYTES_MAX = 64 * 1024
PARAMS_MAX = 1_000
VALUE_BYTES_MAX = 1024 * 1024
BODY_BYTES_MAX = 4 * 1024 * 1024
LABEL_BYTES_MAX = 256
IDEMPOTENCY_KEY_BYTES_MAX = 128
BATCH_SUBMITS_MAX = 1_000
STREAM_SUBMITS_MAX = 100_000
TRACEPARENT_CHARS_MAX = 55
PERSIST_METAS_MAX = 16_384
"""Incoming metas, and synced entries, in one protocol step."""
FORGOTTEN_METAS_MAX = INCOMING_TXS_MOST
"""Forgotten metas in one protocol step: a view install may forget a whole incoming
queue at once, and a step the store refused would stop the coordinator at every
restart."""
STATE_CHANGES_MAX = 65_536
PAGE_SIZE_MAX = 1_000
PAGE_SIZE_DEFAULT = 100
WAIT_SECONDS_MAX = 600.0
WAIT_SECONDS_DEFAULT = 30.0
READ_SYNCED_MAX = 1_024
BODIES_PER_CALL_MAX = 256
"""Bodies in one ReadBodies call, one protocol step or one PushBodies message."""
READ_BODIES_BYTES_DEFAULT = 3 * 1024 * 1024
"""A ReadBodies answer's bodies by default (with a 4 MiB body alone, under gRPC's 8 MiB)."""


def invalid(message: str) -> Refusal:
    return Refusal(Refused.INVALID, message)


def check_tx_id(tx_id: str, field: str = "tx_id") -> str:
    problem = tx_id_problem(tx_id, field)
    if problem is not None:
        raise invalid(problem)
    return tx_id


def check_state(value: int, field: str = "state", *, allow_unspecified: bool = False) -> TxState:
    if value == 0 and allow_unspecified:
        return TxState.INCOMING  # callers treat "unspecified" themselves
    try:
        return TxState(value)
    except ValueError:
        names = ", ".join(f"TX_STATE_{s.name}" for s in TxState)
        raise invalid(f"{field}: {value} is not a transaction state ({names})") from None


def check_idempotency_key(key: str, field: str = "idempotency_key") -> str:
    """At most ``IDEMPOTENCY_KEY_BYTES_MAX`` bytes, and no NUL: PostgreSQL workers keep
    keys as text, which cannot hold one (such a key once stopped every DC applying)."""
    if len(key.encode()) > IDEMPOTENCY_KEY_BYTES_MAX:
        raise invalid(f"{field}: longer than {IDEMPOTENCY_KEY_BYTES_MAX} bytes")
    if "\0" in key:
        raise invalid(f"{field}: contains NUL (U+0000), which PostgreSQL text cannot hold")
    return key


def check_traceparent(value: str) -> str:
    if len(value) > TRACEPARENT_CHARS_MAX:
        raise invalid(f"traceparent: longer than {TRACEPARENT_CHARS_MAX} characters")
    return value


_NONDETERMINISTIC_CALLS = re.compile(
    r"\b(random|randomblob|gen_random_uuid|uuid_generate_v[14]|uuid|setseed|now|"
    r"clock_timestamp|statement_timestamp|transaction_timestamp|timeofday|changes|"
    r"total_changes|last_insert_rowid)\s*\("
)
_NONDETERMINISTIC_WORDS = re.compile(r"\b(localtime|localtimestamp)\b")
_CLOCK_WORDS = re.compile(r"\b(current_timestamp|current_date|current_time)\b")
_STRING = re.compile(r"'(?:[^']|'')*'")

NOW_UNIX_US_MIN = -62_135_596_800_000_000
"""0001-01-01T00:00:00Z, the first time SQLite's date functions read as text."""
NOW_UNIX_US_MAX = 253_402_300_799_999_999
"""9999-12-31T23:59:59.999999Z, the last."""


def nondeterminism(sql: str, *, has_now: bool = False) -> str | None:
    """What in ``sql`` would give each worker its own result (a clock, a random number,
    connection state), or None. Workers must all reach the same state from the same
    statements; a value like this belongs in a parameter, computed once by the client.
    A body that carries its time (``has_now``: ``TxBody.now_unix_us``) may read the
    current time: every SQLite worker reads that time (``sqlite_guard``)."""
    lowered = sql.lower()
    if "'now'" in lowered and not has_now:
        return "'now'"
    code = _STRING.sub("''", lowered)  # names inside string literals are data
    found = _NONDETERMINISTIC_CALLS.search(code)
    if found is not None:
        return f"{found.group(1)}()"
    found = _NONDETERMINISTIC_WORDS.search(code)
    if found is None and not has_now:
        found = _CLOCK_WORDS.search(code)
    return None if found is None else found.group(1)


def check_membership(change: common_pb2.MembershipChange) -> None:
    try:
        check_node_id(change.node_id, "membership.node_id")
        check_url(change.url, "membership.url")
    except WireError as error:
        raise invalid(str(error)) from None
    if change.weight > WEIGHT_MAX:
        raise invalid(f"membership.weight: {change.weight}, more than {WEIGHT_MAX}")


def check_body(
    body: common_pb2.TxBody, encoded_bytes: int, *, allow_nondeterministic: bool = True
) -> None:
    """A transaction body: 1..1000 statements of non-empty SQL within every size limit,
    or a membership entry (no statements). Unless allowed, a statement whose result
    depends on the worker running it is refused (``nondeterminism``)."""
    if encoded_bytes > BODY_BYTES_MAX:
        raise invalid(f"body: {encoded_bytes} bytes encoded, more than {BODY_BYTES_MAX}")
    if body.HasField("membership"):
        if body.statements:
            raise invalid("body: a membership entry carries no statements")
        check_membership(body.membership)
        return
    if not body.statements:
        raise invalid("body: a transaction needs at least one statement")
    if len(body.statements) > STATEMENTS_MAX:
        raise invalid(f"body: {len(body.statements)} statements, more than {STATEMENTS_MAX}")
    if len(body.label.encode()) > LABEL_BYTES_MAX:
        raise invalid(f"body.label: longer than {LABEL_BYTES_MAX} bytes")
    check_idempotency_key(body.idempotency_key, "body.idempotency_key")
    if not NOW_UNIX_US_MIN <= body.now_unix_us <= NOW_UNIX_US_MAX:
        raise invalid(
            f"body.now_unix_us: {body.now_unix_us} is outside 0001-01-01 .. 9999-12-31 "
            "(microseconds since 1970-01-01 UTC)"
        )
    has_now = body.now_unix_us != 0
    for index, statement in enumerate(body.statements):
        where = f"body.statements[{index}]"
        sql_bytes = len(statement.sql.encode())
        if not statement.sql.strip():
            raise invalid(f"{where}.sql: empty")
        if sql_bytes > SQL_BYTES_MAX:
            raise invalid(f"{where}.sql: {sql_bytes} bytes, more than {SQL_BYTES_MAX}")
        if not allow_nondeterministic and (found := nondeterminism(statement.sql, has_now=has_now)):
            raise invalid(
                f"{where}.sql: {found} gives every worker its own value, so replicas would "
                "diverge; pass the value as a parameter (or start the store with "
                "--allow-nondeterministic)"
            )
        if len(statement.params) > PARAMS_MAX:
            raise invalid(f"{where}.params: {len(statement.params)}, more than {PARAMS_MAX}")
        for number, param in enumerate(statement.params):
            kind = param.WhichOneof("value")
            size = 0
            if kind == "text_value":
                size = len(param.text_value.encode())
            elif kind == "blob_value":
                size = len(param.blob_value)
            if size > VALUE_BYTES_MAX:
                limit = VALUE_BYTES_MAX
                raise invalid(f"{where}.params[{number}]: {size} bytes, more than {limit}")


def check_page_size(value: int) -> int:
    if value == 0:
        return PAGE_SIZE_DEFAULT
    if value > PAGE_SIZE_MAX:
        raise invalid(f"page_size: {value}, more than {PAGE_SIZE_MAX}")
    return value


def check_wait_seconds(seconds: float) -> float:
    if seconds < 0:
        raise invalid("timeout: negative")
    if seconds == 0:
        return WAIT_SECONDS_DEFAULT
    if seconds > WAIT_SECONDS_MAX:
        raise invalid(f"timeout: {seconds:.0f} s, more than {WAIT_SECONDS_MAX:.0f} s")
    return seconds


def check_peer_body(tx_id: str, encoded: bytes, digest: bytes) -> common_pb2.TxBody:
    """A peer's body, parsed, within the limits, and matching the origin's digest: the
    store checks it, and the coordinator before its core may count the body as acquired."""
    check_tx_id(tx_id)
    body = common_pb2.TxBody()
    work.count(work.BODY_DECODES)
    try:
        body.ParseFromString(encoded)
    except DecodeError:
        raise invalid("body: not an encoded TxBody") from None
    check_body(body, len(encoded))
    if body_digest(encoded) != digest:
        raise Refusal(Refused.CORRUPT, f"body of {tx_id} fails its digest")
    return body


def check_node_id_field(node_id: str, field: str) -> str:
    """A node id a request names, as INVALID_ARGUMENT naming ``field`` if malformed."""
    try:
        return check_node_id(node_id, field)
    except WireError as error:
        raise invalid(str(error)) from None
