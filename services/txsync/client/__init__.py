"""The TxSync client library: submit write transactions to any DC, follow them, and read,
with failover between DCs, retries that are safe across DCs, and batching built in.

    from txsync.client import Client

    with Client("data/cluster.json") as client:
        done = client.submit("INSERT INTO t (k, v) VALUES (?, ?)", 1, "one", wait="ok")
        rows = client.query("SELECT v FROM t WHERE k = ?", 1, after=done).rows

``AsyncClient`` is the same on asyncio. docs/client.md teaches it, with examples the
tests run.
"""

from txsync.client.async_client import AsyncClient, Reached, Tls
from txsync.client.blocking import Client
from txsync.client.endpoints import Endpoint, EndpointError
from txsync.client.errors import (
    AccessDenied,
    Backpressure,
    InvalidRequest,
    KeyConflict,
    NotFound,
    Timeout,
    TransactionFailed,
    TxSyncError,
    Unavailable,
)
from txsync.client.results import (
    Outcome,
    QueryResult,
    State,
    Statement,
    Submitted,
    Transition,
    TxInfo,
)

__all__ = [
    "AccessDenied", "AsyncClient", "Backpressure", "Client", "Endpoint", "EndpointError",
    "InvalidRequest", "KeyConflict", "NotFound", "Outcome", "QueryResult", "Reached", "State",
    "Statement", "Submitted", "Timeout", "Tls", "TransactionFailed", "Transition", "TxInfo",
    "TxSyncError", "Unavailable",
]  # fmt: skip
