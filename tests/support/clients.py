"""Client-side helpers shared by the tests."""

from __future__ import annotations

from txsync.v1 import client_pb2, client_pb2_grpc


def list_tx_ids(stub: client_pb2_grpc.ClientServiceStub) -> list[str]:
    """Every transaction id a store lists, following the pages to the end."""
    ids: list[str] = []
    token = ""
    while True:
        page = stub.List(client_pb2.ListRequest(page_size=1000, page_token=token))
        ids.extend(t.tx_id for t in page.transactions)
        token = page.next_page_token
        if not token:
            return ids
