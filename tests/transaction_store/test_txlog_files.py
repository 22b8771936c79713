"""The txlog on real files: torn tails are cut and reported, corruption refuses start-up,
rotation survives crashes at each of its steps, and the reader never crashes or hangs."""

from __future__ import annotations

import gzip
import io
import random
import subprocess
import tracemalloc
import uuid
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txsync.transaction_store.retention import CarriedBodies, carried_entries
from txsync.transaction_store.state import StoreState, TxRecord
from txsync.transaction_store.txlog.bodies import SMALL_BODY_BYTES, BodyStore, gzip_body
from txsync.transaction_store.txlog.files import (
    LogCorruptionError,
    LogFiles,
    SnapshotForm,
    snapshot_batches,
    snapshot_payloads,
    write_rotation,
)
from txsync.transaction_store.txlog.framing import HEADER, encode_frame, scan
from txsync.v1 import common_pb2, txlog_pb2


def _batch(counter: int) -> bytes:
    batch = txlog_pb2.LogBatch()
    batch.entries.add(at_unix_ms=counter).counter.counter = counter
    return encode_frame(batch.SerializeToString())


def _write_log(directory: Path, batches: int) -> tuple[Path, list[int]]:
    """A log of ``batches`` counter batches; returns its path and each frame's end."""
    files = LogFiles(directory)
    files.recover(lambda entry: None)
    ends = []
    for counter in range(1, batches + 1):
        files.append_sync(_batch(counter))
        ends.append(files.current_bytes)
    files.close()
    return files.current, ends


def _recover(directory: Path) -> tuple[StoreState, LogFiles]:
    state = StoreState("dc1")
    files = LogFiles(directory)
    files.recover(state.apply)
    return state, files


def test_clean_log_replays_everything(tmp_path: Path) -> None:
    path, _ = _write_log(tmp_path, 20)
    size = path.stat().st_size
    state = StoreState("dc1")
    report = LogFiles(tmp_path).recover(state.apply)
    assert state.counter == 20
    assert report.batches == 20 and report.torn_tail is None
    assert path.stat().st_size == size


@pytest.mark.parametrize("seed", range(12))
def test_torn_tail_at_any_byte_is_cut_and_reported(tmp_path: Path, seed: int) -> None:
    path, ends = _write_log(tmp_path, 10)
    size = path.stat().st_size
    cut_at = random.Random(seed).randrange(ends[0] + 1, size)  # inside some later frame
    with open(path, "r+b") as log:
        log.truncate(cut_at)
    state = StoreState("dc1")
    files = LogFiles(tmp_path)
    report = files.recover(state.apply)
    whole = sum(1 for end in ends if end <= cut_at)
    assert state.counter == whole
    if cut_at in ends:
        assert report.torn_tail is None
    else:
        assert report.torn_tail is not None and path.name in report.torn_tail
        assert path.stat().st_size == ends[whole - 1]  # the torn bytes are gone from disk
    # The cut log takes appends again and replays them.
    files.append_sync(_batch(99))
    files.close()
    again, _ = _recover(tmp_path)
    assert again.counter == 99


def test_zero_filled_tail_is_a_torn_tail(tmp_path: Path) -> None:
    path, _ = _write_log(tmp_path, 5)
    with open(path, "ab") as log:
        log.write(b"\x00" * 4096)  # preallocated blocks a crash left behind
    state = StoreState("dc1")
    report = LogFiles(tmp_path).recover(state.apply)
    assert state.counter == 5
    assert report.torn_tail is not None


@pytest.mark.parametrize("frame", [0, 3, 7])
def test_bit_flip_in_the_middle_refuses_start_naming_file_and_offset(
    tmp_path: Path, frame: int
) -> None:
    path, ends = _write_log(tmp_path, 10)
    start = ends[frame - 1] if frame else 0
    data = bytearray(path.read_bytes())
    data[start + HEADER.size + 3] ^= 0x10  # inside the payload: the checksum fails
    path.write_bytes(bytes(data))
    with pytest.raises(LogCorruptionError) as caught:
        _recover(tmp_path)
    assert caught.value.path == path
    assert caught.value.offset == start
    assert f"{path}" in str(caught.value) and f"offset {start}" in str(caught.value)


def test_bit_flip_in_a_length_field_in_the_middle_refuses_start(tmp_path: Path) -> None:
    path, ends = _write_log(tmp_path, 10)
    data = bytearray(path.read_bytes())
    data[ends[4] + 2] ^= 0x40  # the length of frame 5 now points far away
    path.write_bytes(bytes(data))
    with pytest.raises(LogCorruptionError) as caught:
        _recover(tmp_path)
    assert caught.value.offset == ends[4]


def test_bit_flip_in_the_last_frame_is_a_torn_tail(tmp_path: Path) -> None:
    path, _ = _write_log(tmp_path, 6)
    data = bytearray(path.read_bytes())
    data[-2] ^= 0x01
    path.write_bytes(bytes(data))
    state = StoreState("dc1")
    report = LogFiles(tmp_path).recover(state.apply)
    assert state.counter == 5
    assert report.torn_tail is not None and "checksum" in report.torn_tail


def test_rotation_starts_a_snapshot_file_and_backs_up_the_old(tmp_path: Path) -> None:
    _write_log(tmp_path, 3)
    state, files = _recover(tmp_path)
    snapshot, _ = state.snapshot(truncate_below=0)
    backups = files.rotate(snapshot, at_unix_ms=1)
    files.append_sync(_batch(50))
    files.close()
    assert len(backups) == 1 and backups[0].startswith("bak-")
    assert [p.name for p in tmp_path.glob("log-*.dat")] == [files.current.name]
    again, _ = _recover(tmp_path)
    assert again.counter == 50


def test_crash_between_new_file_and_backup_keeps_the_snapshot_file(tmp_path: Path) -> None:
    """A crash after the new snapshot file is in place but before the old file was
    renamed: recovery must start from the snapshot and back the old file up itself."""
    old_path, _ = _write_log(tmp_path, 3)
    state, files = _recover(tmp_path)
    snapshot, _ = state.snapshot(truncate_below=0)
    kept = old_path.read_bytes()
    files.rotate(snapshot, at_unix_ms=1)
    files.close()
    bak = next(tmp_path.glob("bak-*.dat"))
    bak.unlink()
    old_path.write_bytes(kept + _batch(1))  # the old file is back, as if never renamed
    again, files2 = _recover(tmp_path)
    assert again.counter == 3  # from the snapshot; the old file is superseded
    assert len(list(tmp_path.glob("log-*.dat"))) == 1
    assert len(list(tmp_path.glob("bak-*.dat"))) == 1
    files2.close()


def _held_state(directory: Path, txs: int) -> None:
    """A log of ``txs`` local transactions: the first half synced (some OK), the rest
    INCOMING with their metas known, one without a meta yet; then three stamped submits,
    the first voided by a counter (to be stamped anew), two still open."""
    files = LogFiles(directory)
    files.recover(lambda entry: None)
    batch = txlog_pb2.LogBatch()
    ids = [str(uuid.UUID(int=n + 1, version=4)) for n in range(txs)]
    metas = [common_pb2.TxMeta(tx_id=tx_id, origin="dc1", ts=n + 1) for n, tx_id in enumerate(ids)]
    for n, tx_id in enumerate(ids):
        batch.entries.add(at_unix_ms=n).submitted.CopyFrom(
            txlog_pb2.TxSubmitted(
                tx_id=tx_id, idempotency_key=f"key-{n}", body_digest=b"d" * 32, body_bytes=100,
                service="client", traceparent=f"00-{n:032x}-{n + 1:016x}-01",
            )
        )  # fmt: skip
        if n < txs - 1:
            batch.entries.add(at_unix_ms=n).meta_known.meta.CopyFrom(metas[n])
    synced = batch.entries.add(at_unix_ms=txs).synced
    synced.metas.extend(metas[: txs // 2])
    for n in range(0, txs // 2, 3):
        moved = batch.entries.add(at_unix_ms=txs + n).state
        moved.tx_id, moved.state, moved.service = ids[n], common_pb2.TX_STATE_OK, "wd"
        moved.testing_at_unix_ms = txs + n
        moved.outcome.state = common_pb2.TX_STATE_OK
    for n in range(3):
        batch.entries.add(at_unix_ms=2 * txs).submitted.CopyFrom(
            txlog_pb2.TxSubmitted(
                tx_id=str(uuid.UUID(int=txs + n + 1, version=4)), body_digest=b"d" * 32,
                body_bytes=100, service="client", ts=txs + n + 1, local_seq=n + 1,
            )
        )  # fmt: skip
    batch.entries.add(at_unix_ms=2 * txs).counter.CopyFrom(
        txlog_pb2.CounterRaised(counter=txs + 1, local_seq=0)
    )
    files.append_sync(encode_frame(batch.SerializeToString()))
    files.close()


def _as_compared(state: StoreState) -> tuple[object, ...]:
    records = [
        (r.tx_id, r.seq, r.local, r.meta, r.position, r.idempotency_key, r.body_held,
         r.body_bytes, r.traceparent, r.history, r.outcome, r.membership)
        for r in state.txs.values()
    ]  # fmt: skip
    return (
        records, state.synced, state.synced_offset, state.counter, state.epoch,
        list(state.incoming), list(state.pending_local), state.idempotency,
        state.open_body_bytes, state.incoming_state_txs, state._next_seq,
        list(state.unsettled.items()), state.local_seq, state.coordinator_counter,
    )  # fmt: skip


def test_a_snapshot_larger_than_a_frame_is_split_and_replays_whole(tmp_path: Path) -> None:
    """A snapshot over its frame budget goes in parts (a head, then transactions, then
    synced entries): replayed, the state is the one a single frame gives, in the same
    order, and rotation's pace counts every part as the snapshot."""
    _held_state(tmp_path / "one", 400)
    _held_state(tmp_path / "split", 400)
    results = []
    for name, frame_bytes in (("one", 64 * 1024 * 1024), ("split", 4000)):
        state, _ = _recover(tmp_path / name)
        assert len(state.unsettled) == 2 and len(state.pending_local) == 2  # open, voided
        files = LogFiles(tmp_path / name, snapshot_frame_bytes=frame_bytes)
        files.recover(StoreState("dc1").apply)
        snapshot, _ = state.snapshot(truncate_below=0)
        files.rotate(snapshot, at_unix_ms=1)
        assert files.appended_bytes == 0
        files.close()
        again, reopened = _recover(tmp_path / name)
        assert reopened.appended_bytes == 0  # the parts are the snapshot, not appends
        reopened.close()
        assert _as_compared(again) == _as_compared(state)
        results.append(again)
        frames = scan(reopened.current.read_bytes()).frames
        kinds = []
        for _, payload in frames:
            batch = txlog_pb2.LogBatch.FromString(payload)
            kinds += [entry.WhichOneof("entry") for entry in batch.entries]
        if name == "one":
            assert kinds == ["snapshot"]
        else:
            assert kinds[0] == "snapshot" and len(kinds) > 10
            assert set(kinds[1:]) == {"snapshot_more"}
            assert max(len(payload) for _, payload in frames) < 2 * frame_bytes
    assert _as_compared(results[0]) == _as_compared(results[1])


def test_snapshot_frames_encoded_from_bytes_hold_the_snapshot_message(tmp_path: Path) -> None:
    """The frames are encoded by hand from the kept transactions' bytes (no message per
    transaction): parsed back, one frame is exactly the snapshot as one message, and
    split frames hold its transactions and synced entries in order."""
    _held_state(tmp_path, 400)
    state, files = _recover(tmp_path)
    files.close()
    form, _ = state.snapshot(truncate_below=0)
    whole = form.message()
    assert len(whole.txs) == len(form.txs) == len(state.txs) and not form.head.txs
    (one,) = snapshot_batches(form, at_unix_ms=7)
    assert one.entries[0].at_unix_ms == 7 and one.entries[0].snapshot == whole
    split = snapshot_batches(form, at_unix_ms=7, frame_bytes=3000)
    parts = [batch.entries[0].snapshot_more for batch in split[1:]]
    assert split[0].entries[0].snapshot.parts == len(parts) > 2
    assert [tx for part in parts for tx in part.txs] == list(whole.txs)
    assert [meta for part in parts for meta in part.synced] == list(whole.synced)


def test_forms_prepared_outside_the_lock_give_the_snapshot_built_under_it(
    tmp_path: Path,
) -> None:
    """A rotation builds its kept records' forms into one buffer before it takes the
    lock (``prepare_snapshot``); the snapshot under the lock takes those whose record
    did not change since and builds the rest: one that changed, one new, none for one
    gone or truncated. The snapshot is the one built whole under the lock, and the
    records keep no form of their own."""
    _held_state(tmp_path, 400)
    state, files = _recover(tmp_path)
    files.close()
    synced_ids = [meta.tx_id for meta in state.synced]
    prepared = state.prepare_snapshot(state.kept_records(truncate_below=51))
    assert len(prepared.forms) == len(prepared.records) == len(state.txs) - 50
    assert [bytes(form) for form in prepared.forms] == [
        state._saved(record) for record in prepared.records
    ]
    changed, gone_since = synced_ids[100], next(iter(state.incoming))
    moved = txlog_pb2.LogEntry(at_unix_ms=900)
    moved.state.tx_id, moved.state.service = changed, "wd"
    moved.state.state = moved.state.outcome.state = common_pb2.TX_STATE_OK
    state.apply(moved)
    new = txlog_pb2.LogEntry(at_unix_ms=901)
    new.submitted.CopyFrom(
        txlog_pb2.TxSubmitted(tx_id="tx-new", body_digest=b"n" * 32, service="client")
    )
    state.apply(new)
    state._drop_incoming(gone_since)
    built = []
    build = state._saved

    def counted(record: TxRecord) -> bytes:
        built.append(record.tx_id)
        return build(record)

    state._saved = counted  # type: ignore[method-assign]
    with_prepared, dropped = state.snapshot(51, prepared=prepared)
    assert built == [changed, "tx-new"] and dropped == synced_ids[:50]
    built.clear()
    whole, _ = state.snapshot(51)
    assert len(built) > 300
    assert [bytes(tx) for tx in with_prepared.txs] == [bytes(tx) for tx in whole.txs]
    assert with_prepared.message() == whole.message()
    kept_ids = [tx.tx_id for tx in whole.message().txs]
    assert gone_since not in kept_ids and not set(dropped) & set(kept_ids)
    assert not hasattr(state.txs[changed], "saved")


def test_a_rotation_holds_its_snapshot_once_while_writing_it(tmp_path: Path) -> None:
    """Writing a rotation's file allocates a small part of its snapshot's payload at a
    time (the frame's pieces, its header put in place after them), on top of the forms
    the snapshot holds: what a rotation adds to a store's RSS while it runs. It was twice
    the payload (2.0-2.1x over 2,000-8,000 kept): the payload whole, then a copy of it
    with its header; now 0.2-0.35x (the head with its synced entries, one piece, and a
    64 KiB piece of the rest). Replayed, the file gives the state it was written from."""
    _held_state(tmp_path, 4000)
    state, files = _recover(tmp_path)
    form, _ = state.snapshot(truncate_below=0)
    payload_bytes = sum(len(payload) for payload in snapshot_payloads(form, at_unix_ms=1))
    tracemalloc.start()
    try:
        prepared = files.prepare_rotation(form, (files.current, files.current_bytes), 1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    files.commit_rotation(prepared)
    files.close()
    assert payload_bytes > 1_000_000 and peak < 0.5 * payload_bytes
    again, reopened = _recover(tmp_path)
    reopened.close()
    assert _as_compared(again) == _as_compared(state)


def test_carried_bodies_are_encoded_one_at_a_time_and_framed_in_order() -> None:
    """A rotation's carried bodies go from lists side by side (``CarriedBodies``) to
    entries encoded one at a time as the file is written: framed in batches of about
    ``frame_bytes``, every body comes back once, in order, with what its record said."""
    count = 60
    tx_ids = [f"tx-{n}" for n in range(count)]
    records = {tx_id: TxRecord(tx_id, n) for n, tx_id in enumerate(tx_ids)}
    for n, record in enumerate(records.values()):
        record.body_digest, record.membership = bytes([n]) * 32, n % 7 == 0
        record.traceparent = f"00-{n:032x}-{n:016x}-01"
    bodies = {tx_id: tx_id.encode() * 20 for tx_id in tx_ids}
    carried = CarriedBodies.of(tx_ids, bodies, records)
    form = SnapshotForm(txlog_pb2.Snapshot(synced_len=0))
    new_file = io.BytesIO()
    write_rotation(new_file, form, 5, carried_entries(carried, 9), frame_bytes=2000)
    payloads = [payload for _, payload in scan(new_file.getvalue()).frames]
    assert len(payloads) > 4 and max(map(len, payloads[1:])) <= 2000
    assert txlog_pb2.LogBatch.FromString(payloads[0]).entries[0].HasField("snapshot")
    stored = [
        entry.body_stored
        for payload in payloads[1:]
        for entry in txlog_pb2.LogBatch.FromString(payload).entries
    ]
    assert [s.tx_id for s in stored] == tx_ids
    for s in stored:
        record = records[s.tx_id]
        assert s.carried and s.body == bodies[s.tx_id] and s.body_bytes == len(s.body)
        assert (s.body_digest, s.membership, s.traceparent) == (
            record.body_digest, record.membership, record.traceparent,
        )  # fmt: skip


def test_a_snapshot_missing_a_part_or_out_of_order_refuses_start(tmp_path: Path) -> None:
    """A split snapshot's file is fsynced whole before its rename, so a part missing is
    damage: start-up refuses it rather than start with part of the state."""
    _held_state(tmp_path / "held", 200)
    state, files = _recover(tmp_path / "held")
    files.close()
    snapshot, _ = state.snapshot(truncate_below=0)
    batches = snapshot_batches(snapshot, 1, frame_bytes=2000)
    synced_parts = [n for n, b in enumerate(batches) if b.entries[0].snapshot_more.synced]
    assert batches[0].entries[0].snapshot.parts == len(batches) - 1 and len(synced_parts) >= 2
    frames = [encode_frame(batch.SerializeToString()) for batch in batches]
    first, second = synced_parts[:2]
    swapped = [*frames]
    swapped[first], swapped[second] = frames[second], frames[first]
    for name, written, refusal in (
        ("last", frames[:-1], "snapshot incomplete: 1 parts missing"),
        ("middle", frames[:2] + frames[3:] + [_batch(7)], "snapshot incomplete"),
        ("swapped", swapped, "snapshot part at synced index"),
    ):
        directory = tmp_path / name
        directory.mkdir()
        (directory / "log-1.dat").write_bytes(b"".join(written))
        with pytest.raises(LogCorruptionError, match=refusal):
            _recover(directory)


def test_torn_tail_in_an_older_file_is_corruption(tmp_path: Path) -> None:
    first, _ = _write_log(tmp_path, 3)
    second = tmp_path / f"log-{int(first.name[4:-4]) + 5}.dat"
    second.write_bytes(_batch(9))
    with open(first, "ab") as log:
        log.write(b"\x10\x00\x00")
    with pytest.raises(LogCorruptionError):
        _recover(tmp_path)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600))
def test_scan_never_crashes_on_random_bytes(data: bytes) -> None:
    result = scan(data)
    assert 0 <= result.good_end <= len(data)
    assert result.torn_tail is None or result.corruption is None


@settings(max_examples=200, deadline=None)
@given(frames=st.integers(1, 8), flips=st.lists(st.integers(0, 10_000), min_size=1, max_size=4))
def test_reader_never_crashes_on_mutated_logs(
    tmp_path_factory: pytest.TempPathFactory, frames: int, flips: list[int]
) -> None:
    directory = tmp_path_factory.mktemp("fuzz")
    path, _ = _write_log(directory, frames)
    data = bytearray(path.read_bytes())
    for flip in flips:
        data[flip % len(data)] ^= 1 << (flip % 8)
    path.write_bytes(bytes(data))
    state = StoreState("dc1")
    try:
        LogFiles(directory).recover(state.apply)
    except LogCorruptionError:
        return
    assert state.counter <= frames


@pytest.mark.parametrize("size", [0, 1, 120, SMALL_BODY_BYTES, SMALL_BODY_BYTES + 1, 200_000])
def test_a_body_file_is_gzip_any_reader_reads(tmp_path: Path, size: int) -> None:
    """Small bodies are compressed with a 4 KB window, larger ones with zlib's default
    (``gzip_body``); either way the file is plain gzip, as the seed's layout says: the
    store reads it back and so does the ``gzip`` tool."""
    rng = random.Random(size)
    encoded = bytes(rng.choice(b"INSERT INTO t VALUES (1, 'abc');") for _ in range(size))
    assert gzip.decompress(gzip_body(encoded)) == encoded
    bodies = BodyStore(tmp_path)
    bodies.write("0123abcd-0000-4000-8000-000000000000", encoded)
    assert bodies.read("0123abcd-0000-4000-8000-000000000000") == encoded
    path = bodies.path("0123abcd-0000-4000-8000-000000000000")
    unpacked = subprocess.run(["gzip", "-dc", str(path)], capture_output=True, check=True)
    assert unpacked.stdout == encoded
