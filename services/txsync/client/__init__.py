"""The TxSync client library: submit write transactions to any DC, follow them, and read,
with failover between DCs, retries that are safe across DCs, and batching built in.

    from txsync.client import Client

    with Client("data/cluster.json") as client:
        done = client.submit("INSERT INTO t (k, v) VALUES (?, ?)", 1, "one", wait="ok")
        rows = client.query("SELECT v FROM t WHERE k = ?", 1, after=done).rows

``AsyncClient`` is the same on asyncio. docs/client.md teaches it, with examples the
tests run.

The names below are imported when first used (PEP 562), so that a program importing one
module of the package (the CLI's status commands read ``txsync.client.endpoints``) does
not pay for the rest.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from txsync.client.async_client import AsyncClient
    from txsync.client.blocking import Client
    from txsync.client.connection import Tls
    from txsync.client.core import Reached
    from txsync.client.endpoints import Endpoint, EndpointError
    from txsync.client.errors import (
        AccessDenied,
        Backpressure,
        BatchFailed,
        InvalidRequest,
        KeyConflict,
        NotFound,
        Timeout,
        TransactionFailed,
        TxSyncError,
        Unavailable,
        key_for,
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

_HOMES = {
    "txsync.client.async_client": ("AsyncClient",),
    "txsync.client.connection": ("Tls",),
    "txsync.client.blocking": ("Client",),
    "txsync.client.core": ("Reached",),
    "txsync.client.endpoints": ("Endpoint", "EndpointError"),
    "txsync.client.errors": (
        "AccessDenied", "Backpressure", "BatchFailed", "InvalidRequest", "KeyConflict",
        "NotFound", "Timeout", "TransactionFailed", "TxSyncError", "Unavailable", "key_for",
    ),
    "txsync.client.results": (
        "Outcome", "QueryResult", "State", "Statement", "Submitted", "Transition", "TxInfo",
    ),
}  # fmt: skip
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}
__all__ = [
    "AccessDenied", "AsyncClient", "Backpressure", "BatchFailed", "Client", "Endpoint",
    "EndpointError", "InvalidRequest", "KeyConflict", "NotFound", "Outcome", "QueryResult",
    "Reached", "State", "Statement", "Submitted", "Timeout", "Tls", "TransactionFailed",
    "Transition", "TxInfo", "TxSyncError", "Unavailable", "key_for",
]  # fmt: skip


def __getattr__(name: str) -> Any:
    module = _HOME_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'txsync.client' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
