"""``Client``: the library for code that does not run an event loop.

It is ``AsyncClient`` run on an event loop of its own, in one background thread: every
call hands its coroutine to that loop and blocks until it is answered. So failover,
retries and batching are the same code in both, and submits made from many threads at
once meet in the loop and are gathered into batches as tasks' submits are.
"""

from __future__ import annotations

import asyncio
import builtins
import threading
from collections.abc import Coroutine, Iterable, Iterator, Sequence
from typing import Any, Literal, TypeVar, overload

from txsync.client.async_client import AsyncClient, Reached, Submittable, Wait
from txsync.client.endpoints import Endpoint
from txsync.client.errors import TxSyncError
from txsync.client.results import QueryResult, SqlValue, State, Statement, Submitted, TxInfo

_T = TypeVar("_T")


class Client:
    """A blocking client for the whole cluster; safe to share between threads. Takes
    ``AsyncClient``'s arguments. Use as ``with Client(...) as client:``, or ``close()``.

    >>> with Client("data/cluster.json") as client:  # doctest: +SKIP
    ...     done = client.submit("INSERT INTO t VALUES (?, ?)", 1, "one", wait="ok")
    ...     client.query("SELECT * FROM t", after=done).rows
    ((1, 'one'),)
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="txsync-client", daemon=True
        )
        self._thread.start()
        self._closed = False
        try:
            # Made on the loop: its channels belong to the loop's thread.
            self._client = self._run(_make(args, kwargs))
        except BaseException:
            self._stop()
            raise

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._run(self._client.close())
        finally:
            self._stop()

    def _stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def _run(self, call: Coroutine[Any, Any, _T]) -> _T:
        if threading.current_thread() is self._thread:
            call.close()
            raise RuntimeError("a Client may not be called from its own loop's callbacks")
        return asyncio.run_coroutine_threadsafe(call, self._loop).result()

    @property
    def endpoints(self) -> builtins.list[Endpoint]:
        """The DCs, in the order the client tries them."""
        return self._client.endpoints

    @property
    def current(self) -> Endpoint:
        """The DC in use: the one that answered last."""
        return self._client.endpoints[self._client.current]

    def submit(
        self,
        sql: str | Sequence[Statement],
        *params: SqlValue,
        key: str | None = None,
        wait: Wait = "accepted",
        timeout: float | None = None,
        label: str = "",
    ) -> Submitted:
        """As ``AsyncClient.submit``."""
        return self._run(
            self._client.submit(sql, *params, key=key, wait=wait, timeout=timeout, label=label)
        )

    @overload
    def submit_many(
        self, transactions: Iterable[Submittable], *, keys: Sequence[str] | None = None,
        wait: Wait = "accepted", timeout: float | None = None, raise_errors: Literal[True] = True,
    ) -> builtins.list[Submitted]: ...  # fmt: skip

    @overload
    def submit_many(
        self, transactions: Iterable[Submittable], *, keys: Sequence[str] | None = None,
        wait: Wait = "accepted", timeout: float | None = None, raise_errors: bool,
    ) -> builtins.list[Submitted | TxSyncError]: ...  # fmt: skip

    def submit_many(
        self, transactions: Iterable[Submittable], *, keys: Sequence[str] | None = None,
        wait: Wait = "accepted", timeout: float | None = None, raise_errors: bool = True,
    ) -> builtins.list[Any]:  # fmt: skip
        """As ``AsyncClient.submit_many``."""
        return self._run(
            self._client.submit_many(
                transactions, keys=keys, wait=wait, timeout=timeout, raise_errors=raise_errors
            )
        )

    def get(
        self, tx_id: str = "", *, key: str = "", body: bool = False, timeout: float | None = None
    ) -> TxInfo:
        """As ``AsyncClient.get``."""
        return self._run(self._client.get(tx_id, key=key, body=body, timeout=timeout))

    def wait(
        self, tx_id: str, state: str | State = "ok", *, timeout: float | None = None
    ) -> Reached:
        """As ``AsyncClient.wait``."""
        return self._run(self._client.wait(tx_id, state, timeout=timeout))

    def list(self, state: str | State | None = None, *, page_size: int = 1_000) -> Iterator[TxInfo]:
        """As ``AsyncClient.list``: every transaction, a page fetched as it is needed."""
        token = ""
        while True:
            page, token = self.list_page(state, token, page_size=page_size)
            yield from page
            if not token:
                return

    def list_page(
        self, state: str | State | None = None, page_token: str = "", *, page_size: int = 1_000
    ) -> tuple[builtins.list[TxInfo], str]:
        """As ``AsyncClient.list_page``."""
        return self._run(self._client.list_page(state, page_token, page_size=page_size))

    def query(
        self,
        sql: str,
        *params: SqlValue,
        after: str | Submitted | None = None,
        after_position: int = 0,
        max_rows: int = 1_000,
        timeout: float = 10.0,
        worker: str = "",
    ) -> QueryResult:
        """As ``AsyncClient.query``."""
        return self._run(
            self._client.query(
                sql, *params, after=after, after_position=after_position, max_rows=max_rows,
                timeout=timeout, worker=worker,
            )
        )  # fmt: skip


async def _make(args: tuple[Any, ...], kwargs: dict[str, Any]) -> AsyncClient:
    return AsyncClient(*args, **kwargs)
