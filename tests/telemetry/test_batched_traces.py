"""One trace per transaction, also when many come in one call (issue 51): a batch's
submits each get a trace of their own linked to the call's span, or the trace their
submit names, which the client library fills in from each caller's current span."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import format_trace_id

from tests.support.metrics import sample, scrape
from tests.support.otlp_collector import OtlpCollector
from tests.support.processes import ServiceProcess, free_port, transaction_store
from txsync.client import AsyncClient
from txsync.v1 import client_pb2, client_pb2_grpc, common_pb2

BODY = common_pb2.TxBody(statements=[common_pb2.Statement(sql="CREATE TABLE t (a)")])


@pytest.fixture
def traced_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[ServiceProcess, OtlpCollector, str]]:
    with OtlpCollector() as collector:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "200")
        metrics = f"127.0.0.1:{free_port()}"
        store = transaction_store(tmp_path / "store", "dc1", "--metrics-listen", metrics)
        store.start()
        try:
            yield store, collector, metrics
        finally:
            store.terminate()


def _trace_id(traceparent: str) -> str:
    return traceparent.split("-")[1]


def test_each_submit_of_a_batch_has_its_own_trace_linked_to_the_call(
    traced_store: tuple[ServiceProcess, OtlpCollector, str],
) -> None:
    store, collector, _ = traced_store
    named = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
    with grpc.insecure_channel(store.address) as channel:
        client = client_pb2_grpc.ClientServiceStub(channel)
        submits = [client_pb2.SubmitRequest(body=BODY) for _ in range(3)]
        submits.append(client_pb2.SubmitRequest(body=BODY, traceparent=named))
        answer = client.SubmitBatch(client_pb2.SubmitBatchRequest(submits=submits))
        ids = [result.accepted.tx_id for result in answer.results]
        traces = [client.Get(client_pb2.GetRequest(tx_id=tx_id)).traceparent for tx_id in ids]
    assert _trace_id(traces[3]) == "ab" * 16, "the submit's own trace"
    assert len({_trace_id(t) for t in traces}) == 4, traces

    def linked() -> bool:
        roots = [s for s in collector.spans(lambda s: s.name == "txsync.submit")]
        calls = collector.spans(lambda s: s.name.endswith("SubmitBatch"))
        call_spans = {(c.trace_id, c.span_id) for c in calls}
        return len(roots) == 3 and all(
            (link.trace_id.hex(), link.span_id.hex()) in call_spans
            for root in roots
            for link in root.span.links
        ) and all(len(root.span.links) == 1 for root in roots)  # fmt: skip

    collector.wait_for("three submit roots, each linked to the batch call's span", linked)
    roots = {s.trace_id for s in collector.spans(lambda s: s.name == "txsync.submit")}
    assert roots == {_trace_id(t) for t in traces[:3]}


def test_the_client_keeps_each_callers_trace_through_a_batched_call(
    traced_store: tuple[ServiceProcess, OtlpCollector, str],
) -> None:
    store, _, metrics = traced_store
    tracer = TracerProvider().get_tracer("application")  # not installed globally

    async def callers() -> list[tuple[str, str]]:
        async with AsyncClient(store.address) as client:

            async def one(n: int) -> tuple[str, str]:
                with tracer.start_as_current_span(f"request {n}") as span:
                    submitted = await client.submit("INSERT INTO t VALUES (?)", n, wait="incoming")
                    return format_trace_id(span.get_span_context().trace_id), submitted.tx_id

            made = await asyncio.gather(*(one(n) for n in range(20)))
            return [(trace, (await client.get(tx_id)).traceparent) for trace, tx_id in made]

    for caller_trace, stored in asyncio.run(callers()):
        assert _trace_id(stored) == caller_trace
    batched = sample(scrape(metrics), "grpc_server_handled_total", grpc_method="SubmitBatch")
    assert batched >= 1, "concurrent submits went as batches"
