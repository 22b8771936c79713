"""A DC's txlog files turned into plain rows (no Spark here: executors call this).

Three kinds of rows, one per dataset of ``export``:

* ``synced``: ``(dc, position, tx_id, origin, ts)``, position 1-based;
* ``transactions``: ``(dc, tx_id, origin, ts, local, body_bytes)``, one per transaction
  the DC knows a meta of;
* ``transitions``: ``(dc, tx_id, state, at_unix_ms, service)``.

Files are read in order (``bak-*`` before ``log-*``, then by timestamp); a rotated
file starts with a snapshot repeating the synced entries it keeps, so positions already
seen are not emitted twice. A torn tail (a crash mid-append) ends a file's rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from txsync.transaction_store.state import StoreState
from txsync.transaction_store.txlog.framing import scan
from txsync.v1 import common_pb2, txlog_pb2

Row = tuple[Any, ...]


def txlog_files(dc_data: Path) -> list[Path]:
    """A DC's txlog files, oldest first."""
    directory = dc_data / "txlog"

    def stamp(path: Path) -> tuple[int, int]:
        kind = 0 if path.name.startswith("bak-") else 1
        digits = "".join(ch for ch in path.stem if ch.isdigit())
        return kind, int(digits or 0)

    return sorted(directory.glob("*.dat"), key=stamp)


def rows_of_dc(dc: str, dc_data: Path) -> Iterator[tuple[str, Row]]:
    """Every row of the DC's txlog files, tagged with its dataset's name."""
    yield from rows_of_payloads(dc, _payloads(dc_data))


def entries_of_dc(dc_data: Path) -> Iterator[txlog_pb2.LogEntry]:
    """Every entry of the DC's txlog files, oldest first (a torn tail ends a file)."""
    yield from _entries(_payloads(dc_data))


def _payloads(dc_data: Path) -> Iterator[bytes]:
    for path in txlog_files(dc_data):
        for _, payload in scan(path.read_bytes()).frames:
            yield payload


def _entries(payloads: Iterable[bytes]) -> Iterator[txlog_pb2.LogEntry]:
    for payload in payloads:
        batch = txlog_pb2.LogBatch()
        batch.ParseFromString(payload)
        yield from batch.entries


def rows_of_payloads(dc: str, payloads: Iterable[bytes]) -> Iterator[tuple[str, Row]]:
    """Every row of a DC's txlog frames' payloads (``LogBatch``es), oldest first. The
    transitions are the store's own: replayed through its ``StoreState``, which also
    makes the ones a synced append or a body implies without an entry of their own."""
    seen_positions: set[int] = set()
    known: set[str] = set()
    replayed = StoreState(dc)
    for entry in _entries(payloads):
        yield from _rows_of_entry(dc, entry, seen_positions, known)
        for moved in replayed.apply(entry):
            step = moved.step
            yield "transitions", (dc, moved.record.tx_id, step.state.name, step.at_unix_ms,
                                  step.service)  # fmt: skip


def _rows_of_entry(
    dc: str, entry: txlog_pb2.LogEntry, seen: set[int], known: set[str]
) -> Iterator[tuple[str, Row]]:
    kind = entry.WhichOneof("entry")
    if kind == "meta_known":
        meta = entry.meta_known.meta
        if meta.tx_id not in known:
            known.add(meta.tx_id)
            yield "transactions", (dc, meta.tx_id, meta.origin, meta.ts, meta.origin == dc, 0)
    elif kind == "synced":
        start = entry.synced.start.synced_len
        for offset, meta in enumerate(entry.synced.metas):
            yield from _synced(dc, start + offset + 1, meta, seen, known)
    elif kind == "snapshot":
        snapshot = entry.snapshot
        for offset, meta in enumerate(snapshot.synced):
            yield from _synced(dc, snapshot.synced_offset + offset + 1, meta, seen, known)
    elif kind == "snapshot_more":  # the rest of a snapshot too large for one frame
        more = entry.snapshot_more
        for offset, meta in enumerate(more.synced):
            yield from _synced(dc, more.synced_from + offset + 1, meta, seen, known)


def _synced(
    dc: str, position: int, meta: common_pb2.TxMeta, seen: set[int], known: set[str]
) -> Iterator[tuple[str, Row]]:
    if position in seen:
        return
    seen.add(position)
    if meta.tx_id not in known:
        known.add(meta.tx_id)
        yield "transactions", (dc, meta.tx_id, meta.origin, meta.ts, meta.origin == dc, 0)
    yield "synced", (dc, position, meta.tx_id, meta.origin, meta.ts)
