"""What ``PeerLink`` queues for one peer: body pushes merged into as few messages as the
peer takes, in order, bounded in bytes (the link is never started: no peer needed)."""

from __future__ import annotations

import asyncio

import pytest

from txsync.sync_coordinator import coordinator
from txsync.sync_coordinator.coordinator import PUSH_BATCH_BYTES_MAX, PeerLink
from txsync.transaction_store.validation import BODIES_PER_CALL_MAX
from txsync.v1 import peer_pb2


def _push(n: int, size: int = 100) -> peer_pb2.PushBodyRequest:
    return peer_pb2.PushBodyRequest(tx_id=f"tx-{n}", body=bytes(size))


def _drain(link: PeerLink) -> list[peer_pb2.ExchangeRequest]:
    sent = []
    while link._pending():
        sent.append(link._next_message())
    return sent


def test_pushes_are_merged_into_as_few_messages_as_the_peer_takes() -> None:
    async def scenario() -> None:
        link = PeerLink("dc2", "127.0.0.1:9", None)
        for n in range(1_000):  # one small push per step, as under batched load
            link.push("dc1", _push(n))
        messages = _drain(link)
        await link.close()
        batches = [m.bodies for m in messages]
        assert all(m.WhichOneof("message") == "bodies" for m in messages)
        assert [len(b.bodies) for b in batches] == [256, 256, 256, 232]
        assert [p.tx_id for b in batches for p in b.bodies] == [f"tx-{n}" for n in range(1_000)]
        assert all(b.sender == "dc1" for b in batches)
        assert BODIES_PER_CALL_MAX == 256

    asyncio.run(scenario())


def test_a_body_too_large_to_share_a_message_goes_alone() -> None:
    async def scenario() -> None:
        link = PeerLink("dc2", "127.0.0.1:9", None)
        link.push("dc1", _push(1))
        link.push("dc1", _push(2, PUSH_BATCH_BYTES_MAX + 1))
        link.push("dc1", _push(3))
        messages = _drain(link)
        await link.close()
        kinds = [m.WhichOneof("message") for m in messages]
        assert kinds == ["bodies", "body", "bodies"]
        assert messages[1].body.sender == "dc1" and messages[1].body.tx_id == "tx-2"

    asyncio.run(scenario())


def test_pushes_waiting_past_the_byte_bound_drop_the_oldest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def scenario() -> None:
        link = PeerLink("dc2", "127.0.0.1:9", None)
        for n in range(40):  # 40 MiB against a bound of 16 MiB
            link.push("dc1", _push(n, 1024 * 1024))
        messages = _drain(link)
        await link.close()
        kept = [p.tx_id for m in messages for p in m.bodies.bodies]
        assert kept == [f"tx-{n}" for n in range(24, 40)]

    monkeypatch.setattr(coordinator, "PEER_BODY_BYTES_MAX", 16 * 1024 * 1024)
    asyncio.run(scenario())
