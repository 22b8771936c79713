"""The link emulator delays, keeps order, and cuts, on real sockets."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from txsync.link_emulator import LinkEmulator, LinkSettings


class Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


@pytest.fixture
def echo_port() -> Iterator[int]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Echo)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture
def emulator() -> Iterator[LinkEmulator]:
    emulator = LinkEmulator(seed=1)
    yield emulator
    emulator.close()


def _round_trip(port: int, payload: bytes) -> tuple[bytes, float]:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        started = time.monotonic()
        conn.sendall(payload)
        received = b""
        while len(received) < len(payload):
            chunk = conn.recv(65536)
            if not chunk:
                break
            received += chunk
        return received, (time.monotonic() - started) * 1000


def test_a_round_trip_costs_two_one_way_delays(emulator: LinkEmulator, echo_port: int) -> None:
    port = emulator.add_link("a", "b", echo_port, LinkSettings(delay_ms=40))
    echoed, elapsed_ms = _round_trip(port, b"ping")
    assert echoed == b"ping"
    assert elapsed_ms >= 80  # a lower bound only: the machine may add, never remove


def test_large_payloads_arrive_whole_and_in_order(emulator: LinkEmulator, echo_port: int) -> None:
    port = emulator.add_link("a", "b", echo_port, LinkSettings(delay_ms=2, jitter_ms=5))
    payload = bytes(range(256)) * 4096  # 1 MiB, many chunks, each with its own jitter
    echoed, _ = _round_trip(port, payload)
    assert echoed == payload


def test_cut_closes_connections_and_refuses_until_healed(
    emulator: LinkEmulator, echo_port: int
) -> None:
    emulator.add_link("a", "b", echo_port)
    port = emulator.add_link("b", "a", echo_port)
    emulator.partition({"a"}, {"b"})
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(b"x")
        try:
            answer = conn.recv(10)
        except ConnectionResetError:  # closed with our byte unread: a reset, not an EOF
            answer = b""
        assert answer == b""
    emulator.heal()
    assert _round_trip(port, b"back")[0] == b"back"


def test_unknown_settings_are_refused(emulator: LinkEmulator, echo_port: int) -> None:
    emulator.add_link("a", "b", echo_port)
    with pytest.raises(ValueError, match="no setting 'latency'"):
        emulator.configure("a", "b", latency=5)
