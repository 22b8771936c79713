"""``RecentIds``: the worker's window of applied ids, as digests in one ring."""

from __future__ import annotations

from txsync.worker.recent_ids import DIGEST_BYTES, RecentIds, _digest


def test_the_newest_ids_are_kept_and_the_oldest_forgotten_first() -> None:
    recent = RecentIds(100)
    assert "tx-0" not in recent and len(recent) == 0
    for n in range(250):
        recent.add(f"tx-{n}")
    assert len(recent) == 100
    assert [f"tx-{n}" in recent for n in (0, 149, 150, 249)] == [False, False, True, True]
    assert "tx-250" not in recent and 150 not in recent


def test_an_id_matches_only_a_whole_slot_that_holds_one() -> None:
    """Its digest found across two slots, or in a slot no id was added to yet, is no
    match (written into the ring by hand: no id has such a digest to find)."""
    recent = RecentIds(4)
    recent.add("a")
    recent.add("b")
    half = DIGEST_BYTES // 2
    recent._ring[half : half + DIGEST_BYTES] = _digest("c")  # across slots 0 and 1
    assert "c" not in recent
    recent._ring[3 * DIGEST_BYTES :] = _digest("d")  # slot 3: nothing added there yet
    assert "d" not in recent
    recent._ring[DIGEST_BYTES : 2 * DIGEST_BYTES] = _digest("e")  # slot 1, which holds one
    assert "e" in recent
