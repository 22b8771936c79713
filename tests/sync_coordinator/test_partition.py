"""A partition between real DCs (cut in the link emulator): the orders never fork, and
after healing every acknowledged transaction is in every DC's order, at one position.

With the default exclusion timeout (3 s) a short cut ends before any view change; what
a longer one does (the majority excludes the cut-off DC and goes on) is test_views.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import LocalCluster, submit_at
from txsync.protocol import MEMBERS_MAX


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path, 3, one_way_delay_ms=1)
    yield cluster
    cluster.stop()


def _orders_agree(cluster: LocalCluster) -> list[int]:
    orders = [cluster.synced(dc) for dc in cluster.dcs]
    for order in orders:
        shortest = min(len(order), len(orders[0]))
        assert order[:shortest] == orders[0][:shortest], "the DCs' orders forked"
    return [len(order) for order in orders]


def test_partition_then_heal_converges_without_forking(cluster: LocalCluster) -> None:
    emulator = cluster.emulator
    assert emulator is not None
    acked: list[str] = []
    lock = threading.Lock()
    submit_at(cluster.dcs[0], 10, acked, lock)
    cluster.wait_converged(set(acked))

    emulator.partition({"dc1"}, {"dc2", "dc3"})
    threads = [threading.Thread(target=submit_at, args=(dc, 10, acked, lock)) for dc in cluster.dcs]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:  # while cut: never a fork
        _orders_agree(cluster)
        time.sleep(0.2)
    for thread in threads:
        thread.join()

    emulator.heal()
    order = cluster.wait_converged(set(acked))
    assert len(order) == 40 and len(set(order)) == 40


def test_one_way_cut_and_flapping_links_converge(cluster: LocalCluster) -> None:
    emulator = cluster.emulator
    assert emulator is not None
    acked: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()

    def flap() -> None:
        pairs = list(emulator.links)
        n = 0
        while not stop.is_set():
            source, target = pairs[n % len(pairs)]
            emulator.configure(source, target, cut=True)  # one direction only
            time.sleep(0.05)
            emulator.configure(source, target, cut=False)
            time.sleep(0.05)
            n += 1

    flapper = threading.Thread(target=flap)
    flapper.start()
    try:
        for dc in cluster.dcs:
            submit_at(dc, 8, acked, lock)
            _orders_agree(cluster)
    finally:
        stop.set()
        flapper.join()
    emulator.heal()
    assert len(cluster.wait_converged(set(acked))) == 24


ROOM = 8
"""A coordinator's share of own metas with ``--incoming-txs-max`` 128 (128 / MEMBERS_MAX)."""


def _cut_off_dc_fills_its_room(tmp_path: Path, *, restart_coordinator: bool) -> None:
    """dc1, cut off, is given three times its room; its core holds exactly its room
    (after a restart of its coordinator too, if asked), and once healed all are ordered."""
    cluster = LocalCluster(
        tmp_path,
        3,
        one_way_delay_ms=1,
        coordinator_args=(
            "--round-timeout-ms", "300", "--incoming-txs-max", str(ROOM * MEMBERS_MAX),
        ),
    )  # fmt: skip
    try:
        emulator = cluster.emulator
        assert emulator is not None
        cut_off = cluster.dcs[0]
        emulator.partition({cut_off.node_id}, {dc.node_id for dc in cluster.dcs[1:]})
        acked: list[str] = []
        submit_at(cut_off, 3 * ROOM, acked, threading.Lock())  # all acknowledged, while cut
        cluster.wait_for(
            "the cut-off core to fill its room",
            lambda: cluster.status(cut_off).incoming_len >= ROOM,
        )
        if restart_coordinator:
            cut_off.coordinator.kill()
            cut_off.coordinator.start()
            cluster.wait_for(
                "the restarted core to take its room back",
                lambda: cluster.status(cut_off).incoming_len >= ROOM,
            )
        assert cluster.status(cut_off).incoming_len == ROOM
        emulator.heal()
        order = cluster.wait_converged(set(acked))
        assert len(order) == 3 * ROOM
    finally:
        cluster.stop()


def test_a_cut_off_dcs_submits_wait_in_its_store_not_in_its_core(tmp_path: Path) -> None:
    """A stamped submit is acknowledged before its coordinator holds it, so the core
    cannot refuse it when full: the coordinator takes local submits only while its
    incoming queue holds fewer of its own than its share (here 128 / MEMBERS_MAX = 8),
    the store keeps the rest, and after healing all of them are ordered."""
    _cut_off_dc_fills_its_room(tmp_path, restart_coordinator=False)


def test_a_restarted_cut_off_coordinator_takes_back_no_more_than_its_room(
    tmp_path: Path,
) -> None:
    """The cut-off coordinator is killed with 8 own metas in its core and 16 more stamped
    in its store. Its epoch keeps only the stamps the dead core can have posted, so the
    new core holds 8 again, not 24 (three such cores once held every peer's lowest metas
    out, and no ADD passed); the rest are stamped anew as room frees, and all 24 are
    ordered once the partition heals."""
    _cut_off_dc_fills_its_room(tmp_path, restart_coordinator=True)
