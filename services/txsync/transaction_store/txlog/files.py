"""The txlog's files: ``log-<timestamp>.dat`` (current) and ``bak-<timestamp>.dat``.

Recovery replays the newest log file that begins with a snapshot and every log file after
it; older log files were superseded by a rotation and become ``bak-`` files, which are
never read again and may be deleted. Only the last file may end in a torn tail, which is
cut (and reported); damage anywhere else refuses start-up.
"""

from __future__ import annotations

import os
import time
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import BinaryIO

from google.protobuf.message import DecodeError

from txsync.telemetry import work
from txsync.telemetry.histograms import (
    BYTES_BUCKETS,
    DISK_SECONDS_BUCKETS,
    PlainHistogram,
    process_wide,
)
from txsync.transaction_store.txlog.framing import (
    FRAME_PAYLOAD_BYTES_MAX,
    HEADER,
    scan,
    write_frame,
)
from txsync.v1 import txlog_pb2

PIECE_BYTES = 64 * 1024
"""A rotation writes a snapshot's frame in pieces of about this size (``write_rotation``)."""
TAIL_COPY_BYTES = 1 << 20
"""A rotation's commit copies what was appended meanwhile in pieces of this size."""
LOG_PREFIX = "log-"
BAK_PREFIX = "bak-"
SUFFIX = ".dat"
SNAPSHOT_FRAME_BYTES = 16 * 1024 * 1024
"""A snapshot larger than this is written in several frames (``snapshot_batches``): a
frame holds at most ``FRAME_PAYLOAD_BYTES_MAX`` (64 MiB), and a store that holds a few
hundred thousand transactions (its workers stopped, nothing truncated) makes a larger
snapshot; in one frame every rotation then failed and the log grew without end."""


_SNAPSHOT_LISTS = frozenset({"txs", "synced"})
"""A split snapshot's lists: they go into its parts, not its head."""


class LogCorruptionError(Exception):
    """The txlog is damaged somewhere a crash of ours cannot have damaged it."""

    def __init__(self, path: Path, offset: int, reason: str) -> None:
        super().__init__(
            f"txlog corrupt in {path} at byte offset {offset}: {reason}. Refusing to start: "
            "see 'When the txlog is corrupt' in docs/transaction-store.md."
        )
        self.path = path
        self.offset = offset


@dataclass(slots=True)
class Recovery:
    files_replayed: list[str] = field(default_factory=list)
    batches: int = 0
    entries: int = 0
    entries_since_snapshot: int = 0
    """Of those, the last file's after its snapshot and the bodies its rotation carried:
    what was appended to it since (rotation is paced by them)."""
    torn_tail: str | None = None
    """What was cut from the end of the last file, if anything."""
    superseded: list[str] = field(default_factory=list)
    """Older log files renamed to bak- because a later file starts with a snapshot."""


def _timestamp(path: Path) -> int:
    return int(path.name[len(LOG_PREFIX) : -len(SUFFIX)])


def _backup_stamp(path: Path) -> int | None:
    """The timestamp of a bak- file we named (None: a file of another name, left alone)."""
    stamp = path.name[len(BAK_PREFIX) : -len(SUFFIX)]
    return int(stamp) if stamp.isdigit() else None


FSYNC_SECONDS = process_wide(
    PlainHistogram(
        "txsync.txlog.fsync.duration",
        "time of each fsync of the current log file after an append (what every write of "
        "the store waits for; etcd's wal_fsync_duration_seconds)",
        "s",
        DISK_SECONDS_BUCKETS,
    )
)
FSYNC_BYTES = process_wide(
    PlainHistogram(
        "txsync.txlog.fsync.size", "bytes appended to the log file per fsync", "By", BYTES_BUCKETS
    )
)


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
        work.count(work.FSYNCS)
    finally:
        os.close(fd)


Encoded = bytes | bytearray | memoryview
"""An encoded message, wherever its bytes are."""


class EncodedForms(Sequence[memoryview]):
    """Encoded messages end to end in one buffer, with where each one ends: thousands of
    forms as two allocations, where a ``bytes`` each were thousands of small objects
    made in a burst (a rotation's kept transactions, about 400 bytes each), and the
    pymalloc pools they were spread over outlived the rotation (issue 47). An item is a
    ``memoryview`` of the buffer, made when it is read: take each one in turn and let
    it go (appending to the buffer while one is held raises ``BufferError``)."""

    __slots__ = ("_buffer", "_ends")

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._ends = array("Q")

    def append(self, encoded: Encoded) -> None:
        self._buffer += encoded
        self._ends.append(len(self._buffer))

    def append_from(self, other: EncodedForms, index: int) -> None:
        """Append ``other``'s form at ``index`` (copied: ``other`` may go)."""
        self.append(other[index])

    def __len__(self) -> int:
        return len(self._ends)

    def __getitem__(self, index: int) -> memoryview:  # type: ignore[override]
        if index < 0:
            index += len(self._ends)
        start = self._ends[index - 1] if index else 0
        return memoryview(self._buffer)[start : self._ends[index]]

    def __iter__(self) -> Iterator[memoryview]:
        whole, start = memoryview(self._buffer), 0
        for end in self._ends:
            yield whole[start:end]
            start = end


@dataclass(frozen=True, slots=True)
class SnapshotForm:
    """A snapshot as a rotation writes it: every field but the kept transactions
    (``head``, whose ``txs`` is empty), and those as encoded ``SnapshotTx`` messages.

    Why encoded: a ``SnapshotTx`` message of its own took 2.9 KB in memory (its encoding
    0.4 KB), and a rotation copied each kept one into the snapshot, then into its frame's
    batch. At a batched load's peak (14,000 kept) one rotation raised a store's RSS by
    about 35 MiB while it ran and 20 MiB after (the records kept their forms): the
    high-water mark the soak measured (issue 47, ``docs/benchmarks.md``). The frames are
    encoded from the bytes (``snapshot_payloads``); a rotation's are one buffer
    (``EncodedForms``), which goes with the rotation."""

    head: txlog_pb2.Snapshot
    txs: Sequence[Encoded] = ()

    def message(self) -> txlog_pb2.Snapshot:
        """The whole snapshot as one message (what replaying its frames gives)."""
        whole = txlog_pb2.Snapshot()
        whole.CopyFrom(self.head)
        whole.MergeFromString(_length_delimited(_SNAPSHOT_TXS, self.txs))
        return whole


_SNAPSHOT_TXS = txlog_pb2.Snapshot.DESCRIPTOR.fields_by_name["txs"].number
_MORE_TXS = txlog_pb2.SnapshotMore.DESCRIPTOR.fields_by_name["txs"].number
_ENTRY_SNAPSHOT = txlog_pb2.LogEntry.DESCRIPTOR.fields_by_name["snapshot"].number
_ENTRY_SNAPSHOT_MORE = txlog_pb2.LogEntry.DESCRIPTOR.fields_by_name["snapshot_more"].number
_BATCH_ENTRIES = txlog_pb2.LogBatch.DESCRIPTOR.fields_by_name["entries"].number


def _varint(value: int) -> bytes:
    out = bytearray()
    _put_varint(out, value)
    return bytes(out)


def _put_varint(out: bytearray, value: int) -> None:
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)


def _varint_bytes(value: int) -> int:
    return max(1, (value.bit_length() + 6) // 7)


def _delimited_bytes(tag: bytes, payload_bytes: int) -> int:
    """The bytes of a payload of ``payload_bytes`` as a length-delimited field."""
    return len(tag) + _varint_bytes(payload_bytes) + payload_bytes


def _tag(field_number: int) -> bytes:
    """A length-delimited field's tag."""
    return _varint(field_number << 3 | 2)


def _put_one_delimited(out: bytearray, tag: bytes, payload: Encoded) -> None:
    """Append ``payload`` to ``out`` as one item of a repeated message field (``tag``):
    parsed into a message, the items append to that field (protobuf's encoding, so no
    message is built per item). Into one buffer, item by item: a piece made per item
    was thousands of small objects in a burst, and the pymalloc pools they were spread
    over outlived the rotation (issue 47)."""
    out += tag
    _put_varint(out, len(payload))
    out += payload


def _length_delimited(field_number: int, payloads: Iterable[Encoded]) -> bytes:
    """``payloads`` as the wire form of a repeated message field."""
    out, tag = bytearray(), _tag(field_number)
    for payload in payloads:
        _put_one_delimited(out, tag, payload)
    return bytes(out)


def snapshot_batches(
    snapshot: SnapshotForm, at_unix_ms: int, frame_bytes: int = SNAPSHOT_FRAME_BYTES
) -> list[txlog_pb2.LogBatch]:
    """``snapshot_payloads``, parsed (for tests and tools)."""
    return [
        txlog_pb2.LogBatch.FromString(bytes(payload))
        for payload in snapshot_payloads(snapshot, at_unix_ms, frame_bytes)
    ]


def snapshot_payloads(
    snapshot: SnapshotForm, at_unix_ms: int, frame_bytes: int = SNAPSHOT_FRAME_BYTES
) -> Iterator[bytes]:
    """The encoded batches (a frame each) that start a new log file with ``snapshot``,
    each whole (``_snapshot_frames``; for tests and tools: a rotation writes the
    pieces)."""
    for pieces in _snapshot_frames(snapshot, at_unix_ms, frame_bytes):
        yield b"".join(pieces)


def _snapshot_frames(
    snapshot: SnapshotForm, at_unix_ms: int, frame_bytes: int
) -> Iterator[Iterable[bytes | bytearray]]:
    """The encoded batches (a frame each) that start a new log file with ``snapshot``,
    each as the pieces of its payload in order: one, or if it is larger than
    ``frame_bytes``, its other fields first (``continued``), then parts
    (``SnapshotMore``) of at most about ``frame_bytes`` each, with its transactions and
    then its synced entries, in order. Encoded from the transactions' bytes, one frame
    at a time: no message is built per transaction."""
    head, txs = snapshot.head, snapshot.txs
    assert not head.txs, "the kept transactions travel encoded, in snapshot.txs"
    txs_bytes = sum(len(tx) + 8 for tx in txs)  # 8: the field's tag and length, roughly
    if head.ByteSize() + txs_bytes + 64 <= frame_bytes:  # 64: the batch's and entry's own
        yield _one_entry_batch(
            at_unix_ms, _ENTRY_SNAPSHOT, head.SerializeToString(), _SNAPSHOT_TXS,
            txs, taken=range(len(txs)),
        )  # fmt: skip
        return
    # The parts, planned first (the head names how many there are): runs of the
    # transactions, then of the synced entries, each part at most about frame_bytes.
    parts: list[_Part] = []
    size = 0

    def room_for(item_bytes: int, synced_from: int) -> _Part:
        nonlocal size
        if not parts or (size + item_bytes > frame_bytes and size > 0):
            parts.append(_Part(synced_from))
            size = 0
        size += item_bytes + 8  # the field's tag and length, roughly
        return parts[-1]

    for index in range(len(txs)):
        part = room_for(len(txs[index]), head.synced_offset)
        if not part.txs_count:
            part.txs_first = index
        part.txs_count += 1
    for index, meta in enumerate(head.synced):
        part = room_for(meta.ByteSize(), head.synced_offset + index)
        if not part.synced_count:
            part.synced_first = index
        part.synced_count += 1
    start = txlog_pb2.LogBatch()
    first = start.entries.add(at_unix_ms=at_unix_ms).snapshot
    for descriptor, value in head.ListFields():  # every field, later ones too: not the lists
        if descriptor.name in _SNAPSHOT_LISTS:
            continue
        if descriptor.is_repeated:  # a list added later: it is small, or it joins the parts
            getattr(first, descriptor.name).extend(value)
        elif descriptor.message_type is not None:
            getattr(first, descriptor.name).CopyFrom(value)
        else:
            setattr(first, descriptor.name, value)
    first.continued = True
    first.parts = len(parts)
    yield (start.SerializeToString(),)
    for planned in parts:
        # The part's synced entries copied one at a time (a list of them was a
        # message wrapper each), ahead of its transactions: parsed, the same part.
        more = txlog_pb2.SnapshotMore(synced_from=planned.synced_from)
        add_synced = more.synced.add
        end = planned.synced_first + planned.synced_count
        for meta in islice(head.synced, planned.synced_first, end):
            add_synced().CopyFrom(meta)
        yield _one_entry_batch(
            at_unix_ms, _ENTRY_SNAPSHOT_MORE, more.SerializeToString(), _MORE_TXS,
            txs, taken=range(planned.txs_first, planned.txs_first + planned.txs_count),
        )  # fmt: skip


def write_rotation(
    out: BinaryIO,
    snapshot: SnapshotForm,
    at_unix_ms: int,
    carried: Iterable[bytes] = (),
    frame_bytes: int = SNAPSHOT_FRAME_BYTES,
) -> int:
    """Write to ``out`` (seekable, at its end) the frames that start a rotated log file,
    one at a time; the bytes written. First ``snapshot``'s (``_snapshot_frames``), each
    streamed in pieces with its header put in place after them (``write_frame``): a
    payload of megabytes built whole, then copied into one piece with its header, was
    twice the snapshot held at once on top of its forms. Then the ``carried`` body
    entries (encoded ``LogEntry`` messages, taken one at a time as they come) in batches
    of at most about ``frame_bytes``. The store writes its new file with it; the
    simulator's store (``sim/store.py``) its disk in memory."""
    written = 0
    for pieces in _snapshot_frames(snapshot, at_unix_ms, frame_bytes):
        written += write_frame(out, pieces)
    batch = bytearray()  # a LogBatch of carried entries
    tag = _tag(_BATCH_ENTRIES)
    for entry in carried:
        if batch and len(batch) + len(entry) + 8 > frame_bytes:  # 8: its tag and length
            written += write_frame(out, (batch,))
            batch = bytearray()
        _put_one_delimited(batch, tag, entry)
    if batch:
        written += write_frame(out, (batch,))
    return written


def _one_entry_batch(
    at_unix_ms: int,
    entry_field: int,
    message_head: bytes,
    txs_field: int,
    txs: Sequence[Encoded],
    *,
    taken: range,
) -> Iterator[bytearray]:
    """An encoded ``LogBatch`` of one ``LogEntry``: ``at_unix_ms``, and as its field
    ``entry_field`` the message encoded as ``message_head`` followed by the ``taken``
    items of ``txs`` as its field ``txs_field``; in pieces of about ``PIECE_BYTES``,
    each written once into its own buffer: a snapshot is megabytes, and it was one
    buffer, every concatenation on the way a copy."""
    txs_tag, entry_tag = _tag(txs_field), _tag(entry_field)
    message_bytes = len(message_head) + sum(
        _delimited_bytes(txs_tag, len(txs[index])) for index in taken
    )
    entry_head = txlog_pb2.LogEntry(at_unix_ms=at_unix_ms).SerializeToString()
    entry_bytes = len(entry_head) + _delimited_bytes(entry_tag, message_bytes)
    out = bytearray(_tag(_BATCH_ENTRIES))
    _put_varint(out, entry_bytes)
    out += entry_head
    out += entry_tag
    _put_varint(out, message_bytes)
    out += message_head
    for index in taken:
        _put_one_delimited(out, txs_tag, txs[index])
        if len(out) >= PIECE_BYTES:
            yield out
            out = bytearray()
    if out:
        yield out


@dataclass(slots=True)
class _Part:
    """One ``SnapshotMore`` of a split snapshot, as planned."""

    synced_from: int
    txs_first: int = 0
    """Index in the snapshot's ``txs`` of this part's first transaction."""
    txs_count: int = 0
    synced_first: int = 0
    """Index in the head's ``synced`` of this part's first synced entry."""
    synced_count: int = 0


@dataclass(frozen=True, slots=True)
class PreparedRotation:
    """A new log file written under a temporary name (``LogFiles.prepare_rotation``)."""

    path: Path
    temporary: Path
    snapshot_bytes: int
    """The snapshot's frames and the carried bodies at its start."""
    source: Path
    source_bytes: int
    """The current file and its size when the snapshot was taken: appends after it are
    copied on at the commit."""


class LogFiles:
    def __init__(self, directory: Path, snapshot_frame_bytes: int = SNAPSHOT_FRAME_BYTES) -> None:
        self.directory = directory
        self._snapshot_frame_bytes = snapshot_frame_bytes
        directory.mkdir(parents=True, exist_ok=True)
        self._current: Path | None = None
        self._fd: int | None = None
        self.current_bytes = 0
        self.snapshot_bytes = 0
        """Size of the snapshot frame the current file starts with (0: none)."""

    @property
    def appended_bytes(self) -> int:
        """Bytes appended since the current file's snapshot: what rotation is paced by,
        so that a large snapshot never makes every append rotate again."""
        return self.current_bytes - self.snapshot_bytes

    @property
    def current(self) -> Path:
        assert self._current is not None, "recover() first"
        return self._current

    def log_files(self) -> list[Path]:
        found = [
            p
            for p in self.directory.glob(f"{LOG_PREFIX}*{SUFFIX}")
            if p.name[len(LOG_PREFIX) : -len(SUFFIX)].isdigit()
        ]
        return sorted(found, key=_timestamp)

    def recover(self, apply: Callable[[txlog_pb2.LogEntry], object]) -> Recovery:
        """Replay the log into ``apply`` and open the last file for appending."""
        report = Recovery()
        for unfinished in self.directory.glob(f"{LOG_PREFIX}*.tmp"):
            unfinished.unlink()  # a rotation a crash cut before its commit
        files = self.log_files()
        if not files:
            self._open(self._new_path())
            return report
        start = 0
        for index, path in enumerate(files):
            if _snapshot_frame_bytes(path):
                start = index
        for old in files[:start]:
            report.superseded.append(self._to_backup(old))
        live = files[start:]
        for index, path in enumerate(live):
            is_last = index == len(live) - 1
            data = path.read_bytes()
            result = scan(data)
            if result.corruption is not None:
                raise LogCorruptionError(path, result.good_end, result.corruption)
            if result.torn_tail is not None:
                if not is_last:
                    raise LogCorruptionError(path, result.good_end, result.torn_tail)
                cut = len(data) - result.good_end
                report.torn_tail = (
                    f"cut {cut} bytes at {path.name}:{result.good_end} ({result.torn_tail})"
                )
                with open(path, "r+b") as log:
                    log.truncate(result.good_end)
                    log.flush()
                    os.fsync(log.fileno())
            snapshot_end = 0
            parts_missing = 0
            since_snapshot = 0
            for offset, payload in result.frames:
                batch = txlog_pb2.LogBatch()
                try:
                    batch.ParseFromString(payload)
                except DecodeError as error:
                    raise LogCorruptionError(path, offset, f"undecodable batch: {error}") from None
                first = batch.entries[0] if batch.entries else None
                kind = first.WhichOneof("entry") if first is not None else None
                if parts_missing and kind != "snapshot_more":
                    raise LogCorruptionError(
                        path, offset, f"snapshot incomplete: {parts_missing} parts missing"
                    )
                if first is not None and kind == "snapshot" and offset == 0:
                    parts_missing = first.snapshot.parts if first.snapshot.continued else 0
                    snapshot_end = offset + HEADER.size + len(payload)
                elif kind == "snapshot_more" and parts_missing:
                    parts_missing -= 1
                    snapshot_end = offset + HEADER.size + len(payload)
                elif (
                    first is not None
                    and kind == "body_stored"
                    and first.body_stored.carried
                    and offset == snapshot_end > 0
                ):
                    snapshot_end = offset + HEADER.size + len(payload)  # the rotation's too
                for entry in batch.entries:
                    try:
                        apply(entry)
                    except (ValueError, KeyError, AssertionError) as error:
                        raise LogCorruptionError(path, offset, f"unusable entry: {error}") from None
                    report.entries += 1
                if offset >= snapshot_end:
                    since_snapshot += len(batch.entries)
                report.batches += 1
            if parts_missing:
                raise LogCorruptionError(
                    path, result.good_end, f"snapshot incomplete: {parts_missing} parts missing"
                )
            report.files_replayed.append(path.name)
            report.entries_since_snapshot = since_snapshot
        self._open(live[-1])
        self.snapshot_bytes = snapshot_end  # of the last file: rotation's pace
        return report

    def append_sync(self, data: bytes) -> None:
        """Append frames and fsync (called from a worker thread by the writer)."""
        assert self._fd is not None
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        started = time.perf_counter()
        os.fsync(self._fd)
        FSYNC_SECONDS.record(time.perf_counter() - started)
        FSYNC_BYTES.record(len(data))
        work.count(work.FSYNCS)
        self.current_bytes += len(data)

    def rotate(
        self,
        snapshot: SnapshotForm,
        at_unix_ms: int,
        carried: Iterable[bytes] = (),
    ) -> list[str]:
        """Start a new log file that begins with ``snapshot`` and the ``carried`` body
        entries (encoded ``LogEntry`` messages, in frames of at most the snapshot's frame
        size); older files become bak-. ``prepare_rotation`` and ``commit_rotation`` in
        one."""
        covered = (self.current, self.current_bytes)
        return self.commit_rotation(self.prepare_rotation(snapshot, covered, at_unix_ms, carried))

    def prepare_rotation(
        self,
        snapshot: SnapshotForm,
        covered: tuple[Path, int],
        at_unix_ms: int,
        carried: Iterable[bytes] = (),
    ) -> PreparedRotation:
        """The new log file, written and synced under a temporary name, while appends
        go on to the current one. ``snapshot`` describes the current file up to
        ``covered`` (its path and size when the snapshot was taken, nothing staged
        unwritten): ``commit_rotation`` copies on from there. Nothing changes for
        recovery until the commit: a crash leaves a ``.tmp`` file that no one reads."""
        path = self._new_path()
        temporary = path.with_suffix(".tmp")
        with open(temporary, "wb") as out:
            written = write_rotation(out, snapshot, at_unix_ms, carried, self._snapshot_frame_bytes)
            out.flush()
            os.fsync(out.fileno())
        work.count(work.FSYNCS)
        source, source_bytes = covered
        return PreparedRotation(path, temporary, written, source, source_bytes)

    def commit_rotation(self, prepared: PreparedRotation) -> list[str]:
        """Copy what was appended to the current file since ``prepare_rotation`` (whole
        frames: the writer has flushed) after the new file's snapshot, sync it, and make
        it the current file; older files become bak-. The caller holds the writer
        still: the copy is all that was appended meanwhile, not the history."""
        assert prepared.source == self.current, "a rotation is prepared from the current file"
        old_files = self.log_files()
        tail_bytes = self.current_bytes - prepared.source_bytes
        if tail_bytes > 0:
            with open(prepared.source, "rb") as source, open(prepared.temporary, "ab") as out:
                source.seek(prepared.source_bytes)
                # In pieces: under a batched load the tail is megabytes, and read whole it
                # was held at once while the writer waited.
                while tail_bytes > 0:
                    piece = source.read(min(tail_bytes, TAIL_COPY_BYTES))
                    assert piece, "the current file ends before what was appended to it"
                    out.write(piece)
                    tail_bytes -= len(piece)
                out.flush()
                os.fsync(out.fileno())
            work.count(work.FSYNCS)
        os.replace(prepared.temporary, prepared.path)
        fsync_dir(self.directory)
        self._close()
        self._open(prepared.path)
        self.snapshot_bytes = prepared.snapshot_bytes
        backups = [self._to_backup(old) for old in old_files]
        return backups

    def discard_rotation(self, prepared: PreparedRotation) -> None:
        """A prepared rotation not committed (the store is shutting down)."""
        prepared.temporary.unlink(missing_ok=True)

    def delete_backups(self, kept: int) -> list[str]:
        """Delete all but the newest ``kept`` bak- files; the names deleted. Nothing
        reads them once retired (recovery starts at the newest snapshot), so disk holds
        the current file and these, whatever the history."""
        stamped = [
            (stamp, path)
            for path in self.directory.glob(f"{BAK_PREFIX}*{SUFFIX}")
            if (stamp := _backup_stamp(path)) is not None
        ]
        backups = [path for _, path in sorted(stamped)]
        gone = backups[: max(0, len(backups) - kept)]
        for path in gone:
            path.unlink(missing_ok=True)
        if gone:
            fsync_dir(self.directory)
        return [path.name for path in gone]

    def close(self) -> None:
        self._close()

    def _new_path(self) -> Path:
        stamp = time.time_ns()
        existing = self.log_files()
        if existing:
            stamp = max(stamp, _timestamp(existing[-1]) + 1)
        return self.directory / f"{LOG_PREFIX}{stamp}{SUFFIX}"

    def _open(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        fsync_dir(self.directory)
        self._current = path
        self.current_bytes = path.stat().st_size

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _to_backup(self, path: Path) -> str:
        target = path.with_name(BAK_PREFIX + path.name[len(LOG_PREFIX) :])
        os.replace(path, target)
        fsync_dir(self.directory)
        return target.name


def _snapshot_frame_bytes(path: Path) -> int:
    """The size of the file's first frame if it is whole and holds a snapshot, else 0
    (reads only that frame)."""
    with open(path, "rb") as log:
        header = log.read(HEADER.size)
        if len(header) < HEADER.size:
            return 0
        length, _ = HEADER.unpack(header)
        if not 0 < length <= FRAME_PAYLOAD_BYTES_MAX:
            return 0
        frame = header + log.read(length)
    result = scan(frame)
    if not result.frames:
        return 0
    batch = txlog_pb2.LogBatch()
    try:
        batch.ParseFromString(result.frames[0][1])
    except DecodeError:
        return 0
    if batch.entries and batch.entries[0].WhichOneof("entry") == "snapshot":
        return len(frame)
    return 0
