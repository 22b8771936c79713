"""A user-space WAN between DCs on one machine (these machines have no ``tc netem``).

One TCP proxy per directed link: DC A's coordinator reaches DC B through the proxy
``A->B``, which forwards to B and delays the bytes of both directions of that connection
by the link's one-way delay (so a call over it costs about two one-way delays), keeps
each direction in order, and can add jitter, stalls standing in for packet loss (a TCP
stream never loses bytes: a lost packet shows up as a retransmission stall), and a cut
switch that closes every connection and refuses new ones until it is healed.

Test and benchmark tooling, and what ``txsync dev up`` uses to inject WAN delay. It
listens on loopback only.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

CHUNK_BYTES = 64 * 1024
LOSS_STALL_MS = 200
"""How long a 'lost' chunk stalls its direction (a typical minimum retransmission time)."""


@dataclass(slots=True)
class LinkSettings:
    delay_ms: float = 0.0
    """One-way delay, added to each direction of every connection over the link."""
    jitter_ms: float = 0.0
    """Uniform extra delay in [0, jitter_ms]; order within a direction is kept."""
    loss: float = 0.0
    """Probability that a chunk stalls LOSS_STALL_MS (as a retransmission would)."""
    cut: bool = False


class Link:
    def __init__(self, name: str, target_port: int, settings: LinkSettings, seed: int) -> None:
        self.name = name
        self.target_port = target_port
        self.settings = settings
        self.port = 0
        self.bytes_forwarded = 0
        self._rng = random.Random(seed)
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.StreamWriter] = set()

    async def start(self, port: int = 0) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self.drop_connections()

    def drop_connections(self) -> None:
        for writer in list(self._connections):
            writer.close()
        self._connections.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.settings.cut:
            writer.close()
            return
        try:
            target_reader, target_writer = await asyncio.open_connection(
                "127.0.0.1", self.target_port
            )
        except OSError:
            writer.close()
            return
        self._connections.update((writer, target_writer))
        await asyncio.gather(self._pump(reader, target_writer), self._pump(target_reader, writer))
        for end in (writer, target_writer):
            self._connections.discard(end)
            end.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Forward one direction, each chunk released at its arrival time plus the delay."""
        released_at = 0.0
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, chunk = await queue.get()
                if not chunk:
                    return
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                if self.settings.cut:
                    writer.close()
                    return
                writer.write(chunk)
                await writer.drain()
                self.bytes_forwarded += len(chunk)

        sender = asyncio.get_running_loop().create_task(deliver())
        try:
            while True:
                chunk = await reader.read(CHUNK_BYTES)
                settings = self.settings
                extra = self._rng.uniform(0, settings.jitter_ms) if settings.jitter_ms else 0.0
                if settings.loss and self._rng.random() < settings.loss:
                    extra += LOSS_STALL_MS
                due = time.monotonic() + (settings.delay_ms + extra) / 1000
                released_at = max(released_at, due)  # a direction stays in order
                await queue.put((released_at, chunk))
                if not chunk:
                    break
            await sender
        except (ConnectionError, OSError):
            pass
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError, OSError):
                await sender
            with contextlib.suppress(ConnectionError, OSError, RuntimeError):
                writer.close()


class LinkEmulator:
    """Links between named nodes, run on an event loop in a background thread."""

    def __init__(self, seed: int = 0) -> None:
        self._seed = seed
        self.links: dict[tuple[str, str], Link] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()

    def _call(self, work: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(work, self._loop).result(timeout=10)

    def add_link(
        self, source: str, target: str, target_port: int, settings: LinkSettings | None = None
    ) -> int:
        """Proxy ``source -> target``; returns the port ``source`` must dial instead."""
        link = Link(
            f"{source}->{target}",
            target_port,
            settings or LinkSettings(),
            seed=self._seed + len(self.links),
        )
        self._call(link.start())
        self.links[(source, target)] = link
        return link.port

    def configure(self, source: str, target: str, **changes: float | bool) -> None:
        settings = self.links[(source, target)].settings
        for name, value in changes.items():
            if not hasattr(settings, name):
                raise ValueError(f"links have no setting {name!r}")
            setattr(settings, name, value)
        if changes.get("cut"):
            self._loop.call_soon_threadsafe(self.links[(source, target)].drop_connections)

    def set_all(self, **changes: float | bool) -> None:
        for source, target in self.links:
            self.configure(source, target, **changes)

    def partition(self, *groups: set[str]) -> None:
        """Cut every link between different groups (both directions); heal the rest."""
        for source, target in self.links:
            apart = not any(source in group and target in group for group in groups)
            self.configure(source, target, cut=apart)

    def heal(self) -> None:
        self.set_all(cut=False)

    def close(self) -> None:
        for link in self.links.values():
            self._call(link.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
