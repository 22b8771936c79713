"""Merging the ``Ready`` batches of several steps into one store write.

The coordinator steps the core once per event but persists once per batch of events:
everything durable the batch produced goes to the transaction-store in one
``PersistStep`` (one fsync), and only then is anything sent. Merging keeps the core's
order: counters take the highest, metas and state changes keep their order, and synced
appends (always contiguous) become one append from the first start.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from txsync.protocol import (
    MergeBase,
    PersistCounter,
    PersistIncoming,
    PersistSynced,
    Ready,
    StateChanged,
    TxMeta,
)


@dataclass(slots=True)
class MergedPersist:
    counter: int = 0
    incoming: list[TxMeta] = field(default_factory=list)
    synced_start: MergeBase | None = None
    synced: list[TxMeta] = field(default_factory=list)
    changes: list[StateChanged] = field(default_factory=list)

    def add(self, ready: Ready) -> None:
        for effect in ready.persist:
            match effect:
                case PersistCounter(counter):
                    self.counter = max(self.counter, counter)
                case PersistIncoming(metas):
                    self.incoming.extend(metas)
                case PersistSynced(start, metas):
                    if self.synced_start is None:
                        self.synced_start = start
                    else:
                        end = self.synced_start.synced_len + len(self.synced)
                        assert start.synced_len == end, "synced appends are contiguous"
                    self.synced.extend(metas)
        self.changes.extend(ready.state_changes)

    def is_empty(self) -> bool:
        return not (self.counter or self.incoming or self.synced or self.changes)
