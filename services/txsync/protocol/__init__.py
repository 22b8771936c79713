"""The pure TxLog sync protocol core (PROTOCOL.md §1, §2, §5).

Imports nothing that does I/O, reads a clock or draws random numbers: feed events to
``ProtocolNode.step`` and apply the returned ``Ready`` in its documented order.
"""

from txsync.protocol.events import (
    BodyAcquired,
    Event,
    FetchBody,
    LocalTx,
    PersistCounter,
    PersistIncoming,
    PersistSynced,
    PostReceived,
    PushBody,
    Ready,
    Rejected,
    SendPost,
    SendSyncedEntries,
    ServeCatchUpFromLog,
    StateChanged,
    SyncedEntriesReceived,
    Tick,
)
from txsync.protocol.limits import MEMBERS_MAX, Limits, Timing
from txsync.protocol.model import (
    ALLOWED_TRANSITIONS,
    GENESIS_TX_ID,
    MergeBase,
    Message,
    NodeId,
    Post,
    SyncedEntries,
    TxId,
    TxMeta,
    TxState,
    is_allowed_transition,
)
from txsync.protocol.node import DurableState, Mode, ProtocolNode
from txsync.protocol.queues import IncomingQueue, SyncedQueue, addable_prefix

__all__ = [
    "ALLOWED_TRANSITIONS",
    "GENESIS_TX_ID",
    "MEMBERS_MAX",
    "BodyAcquired",
    "DurableState",
    "Event",
    "FetchBody",
    "IncomingQueue",
    "Limits",
    "LocalTx",
    "MergeBase",
    "Message",
    "Mode",
    "NodeId",
    "PersistCounter",
    "PersistIncoming",
    "PersistSynced",
    "Post",
    "PostReceived",
    "ProtocolNode",
    "PushBody",
    "Ready",
    "Rejected",
    "SendPost",
    "SendSyncedEntries",
    "ServeCatchUpFromLog",
    "StateChanged",
    "SyncedEntries",
    "SyncedEntriesReceived",
    "SyncedQueue",
    "Tick",
    "Timing",
    "TxId",
    "TxMeta",
    "TxState",
    "addable_prefix",
    "is_allowed_transition",
]
