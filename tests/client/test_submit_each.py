"""Single submits travel as messages on one ``SubmitEach`` stream per DC (client/
submit_each.py), against a real store: one stream serves every caller while it lasts,
a stream that broke is opened again, and a store that has no ``SubmitEach`` (the
previous release's) is sent unary calls."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.support.metrics import sample, scrape
from tests.support.processes import ServiceProcess, free_port, transaction_store
from tests.support.releases import previous_release
from txsync.client import AsyncClient, Client, State
from txsync.client.submit_each import STREAMS_LIMIT
from txsync.transaction_store.service import SUBMIT_EACH_STREAMS_MAX
from txsync.v1 import client_pb2, client_pb2_grpc, common_pb2

CALLERS = 8
EACH = 25
INCOMING = "incoming"
"""Answered once durable: a store alone orders nothing."""


@pytest.fixture
def store(tmp_path: Path) -> Iterator[tuple[ServiceProcess, str]]:
    metrics = f"127.0.0.1:{free_port()}"
    process = transaction_store(
        tmp_path / "store", "dc1", "--metrics-listen", metrics, port=free_port()
    )  # a fixed port: a test restarts it there
    process.start()
    try:
        yield process, metrics
    finally:
        process.terminate()


def _handled(metrics: str, method: str, kind: str = "unary") -> float:
    """Calls of ``method`` the store handled as ``kind`` (0 if none): a ``SubmitEach``
    stream counts as ``bidi_stream`` once it ended, each of its messages as ``unary``."""
    try:
        return sample(
            scrape(metrics), "grpc_server_handled_total", grpc_method=method, grpc_type=kind
        )
    except AssertionError:
        return 0


def _opened(client: Client | AsyncClient) -> list[int]:
    """Streams opened to each DC the client sent a submit."""
    return [stream.opened for stream in client._transport.submit_streams.values()]


def test_threads_submitting_one_at_a_time_share_one_stream(
    store: tuple[ServiceProcess, str],
) -> None:
    process, metrics = store
    tx_ids: list[str] = []
    lock = threading.Lock()
    with Client(process.address, batch_max=1, in_flight_max=CALLERS) as client:

        def caller(n: int) -> None:
            for k in range(EACH):
                submitted = client.submit("INSERT INTO t VALUES (?)", n * EACH + k, wait=INCOMING)
                with lock:
                    tx_ids.append(submitted.tx_id)

        threads = [threading.Thread(target=caller, args=(n,)) for n in range(CALLERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert len(set(tx_ids)) == CALLERS * EACH
        assert _opened(client) == [1]
    # Closing the client ends the stream: the store counts it handled, each submit on it
    # as a call of its own (rates and latencies by method), and no unary Submit.
    assert _handled(metrics, "SubmitEach", "bidi_stream") == 1
    assert _handled(metrics, "SubmitEach") == CALLERS * EACH
    assert _handled(metrics, "Submit") == 0


def test_an_event_loops_callers_share_one_stream_and_a_broken_one_is_opened_again(
    store: tuple[ServiceProcess, str],
) -> None:
    process, metrics = store

    async def main() -> None:
        async with AsyncClient(process.address, batch_max=1, in_flight_max=CALLERS) as client:
            answers = await asyncio.gather(
                *(
                    client.submit("INSERT INTO t VALUES (?)", n, wait=INCOMING)
                    for n in range(CALLERS * EACH)
                )
            )
            assert len({a.tx_id for a in answers}) == CALLERS * EACH
            assert _opened(client) == [1]
            # The store restarts on its port: the stream breaks, and the next submit
            # (retried by the client's rules if it met the break) opens another.
            process.terminate()
            process.start()
            again = await client.submit("INSERT INTO t VALUES (?)", -1, wait=INCOMING)
            assert again.tx_id not in {a.tx_id for a in answers}
            assert _opened(client) == [2]
        assert _handled(metrics, "SubmitEach", "bidi_stream") == 1
        assert _handled(metrics, "Submit") == 0

    asyncio.run(main())


def test_a_store_without_submit_each_is_sent_unary_submits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The previous release's store answers ``SubmitEach`` UNIMPLEMENTED: nothing was
    taken, and the client sends that submit and the rest as unary calls."""
    previous = previous_release().unpack(tmp_path / "previous")
    monkeypatch.setenv("PYTHONPATH", str(previous))
    process = transaction_store(tmp_path / "store", "dc1")
    process.start()
    try:
        with Client(process.address, batch_max=1) as client:
            first = client.submit("INSERT INTO t VALUES (?)", 1, wait=INCOMING)
            second = client.submit("INSERT INTO t VALUES (?)", 2, wait=INCOMING)
            assert first.tx_id != second.tx_id
            assert _opened(client) == [1]
            assert all(s.not_served for s in client._transport.submit_streams.values())
            assert client.get(second.tx_id).state is State.INCOMING
    finally:
        process.terminate()


def test_a_client_the_store_refuses_a_stream_sends_unary_calls(
    store: tuple[ServiceProcess, str],
) -> None:
    """The store holds at most 768 ``SubmitEach`` streams for one caller (three quarters
    of 1,024; without access control a caller is its host): the next one's first message
    is answered with the refusal, and a client refused so sends the same submit as a
    unary call."""
    process, metrics = store
    share = SUBMIT_EACH_STREAMS_MAX - SUBMIT_EACH_STREAMS_MAX // 4

    async def main() -> None:
        async with grpc.aio.insecure_channel(process.address) as channel:
            stub = client_pb2_grpc.ClientServiceStub(channel)
            held = [stub.SubmitEach() for _ in range(share + 1)]
            body = common_pb2.TxBody(statements=[common_pb2.Statement(sql="SELECT 1")])
            submit = client_pb2.SubmitEachRequest(
                call_id=1, submit=client_pb2.SubmitRequest(body=body)
            )

            async def answer(call: Any) -> client_pb2.SubmitResult:
                await call.write(submit)
                answered: client_pb2.SubmitEachResponse = await call.read()
                return answered.result

            results = await asyncio.gather(*(answer(call) for call in held))
            refused = [result.error for result in results if result.error]
            assert len(refused) == 1, refused[:3]
            assert refused[0].startswith("RESOURCE_EXHAUSTED") and STREAMS_LIMIT in refused[0]
            with Client(process.address, batch_max=1) as client:
                submitted = client.submit("INSERT INTO t VALUES (?)", 1, wait=INCOMING)
                assert client.get(submitted.tx_id).state is State.INCOMING
                assert _opened(client) == [1]
            for call in held:
                call.cancel()
        assert _handled(metrics, "Submit") == 1

    asyncio.run(main())
