"""Start real TxSync service processes for tests, and stop or kill them."""

from __future__ import annotations

import atexit
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2

from txsync.command_lines import coordinator_args, dispatch_args, store_args, worker_args
from txsync.parent_watch import child_environment
from txsync.rpc import RECONNECT_OPTIONS, health_status

__all__ = [
    "ServiceProcess",
    "free_port",
    "health_status",
    "sync_coordinator",
    "transaction_store",
    "wait_serving",
    "worker",
    "worker_dispatch",
]

START_TIMEOUT_S = 180.0
"""Generous: a loaded 2-core machine may take long to start a Python service."""
_RUNNING: set[subprocess.Popen[bytes]] = set()


@atexit.register
def _kill_leftovers() -> None:
    """A test that failed half-way must not leave services running after pytest exits."""
    for process in _RUNNING:
        if process.poll() is None:
            process.kill()


def wait_serving(address: str, process: subprocess.Popen[bytes], deadline: float) -> bool:
    """Poll ``address``'s health until it is SERVING (true), ``process`` exits or the
    monotonic ``deadline`` passes (false). A check that fails drops its channel, as
    ``dev_cluster.Service.check_serving`` does: a start is seen when it happens, not at
    gRPC's next reconnect attempt (what ``make bench-startup`` times with this)."""
    channel: grpc.Channel | None = None
    try:
        while process.poll() is None and time.monotonic() <= deadline:
            if channel is None:
                channel = grpc.insecure_channel(address, options=list(RECONNECT_OPTIONS))
            try:
                if health_status(channel) == health_pb2.HealthCheckResponse.SERVING:
                    return True
            except grpc.RpcError:
                channel.close()
                channel = None
            time.sleep(0.02)
    finally:
        if channel is not None:
            channel.close()
    return False


class ServiceProcess:
    """One ``txsync <service>`` process listening on a free loopback port."""

    def __init__(
        self,
        args: list[str],
        workdir: Path,
        name: str,
        listen: str = "127.0.0.1:0",
        *,
        plaintext_health: bool = True,
    ) -> None:
        """``plaintext_health`` False: the service speaks TLS only; it is ready once it has
        written its port file (which services do after they have fully started)."""
        self._args = args
        self._listen = listen
        self._plaintext_health = plaintext_health
        self._workdir = workdir
        self._name = name
        self.port_file = workdir / f"{name}.port"
        self.log_path = workdir / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.address = ""
        self.starts = 0

    def start(self) -> str:
        assert self.process is None or self.process.poll() is not None, "already running"
        self.port_file.unlink(missing_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child from here on
        command = [sys.executable, "-m", "txsync.cli.main", *self._args]
        command += ["--listen", self._listen, "--port-file", str(self.port_file)]
        self.process = subprocess.Popen(
            command, stdout=log, stderr=log, cwd=self._workdir, env=child_environment()
        )
        _RUNNING.add(self.process)
        log.close()
        self.starts += 1
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.port_file.exists():
            if self.process.poll() is not None:
                raise RuntimeError(f"{self._name} exited {self.process.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self._name} did not start in time:\n{self.log()}")
            time.sleep(0.01)
        self.address = self.port_file.read_text()
        if self._plaintext_health:
            self._wait_serving(deadline)
        return self.address

    def _wait_serving(self, deadline: float) -> None:
        assert self.process is not None
        if not wait_serving(self.address, self.process, deadline):
            raise RuntimeError(f"{self._name} never became healthy:\n{self.log()}")

    def kill(self) -> None:
        """SIGKILL: no chance to flush anything."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def terminate(self, timeout_s: float = 20.0) -> int:
        """SIGTERM and wait for a graceful exit; returns the exit status."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout_s)

    @property
    def workdir(self) -> Path:
        """Where the service keeps its data (its ``--data``, for the stores)."""
        return self._workdir

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def transaction_store(
    data_dir: Path, node_id: str = "dc1", *extra: str, port: int = 0
) -> ServiceProcess:
    data_dir.mkdir(parents=True, exist_ok=True)
    args = store_args(node_id, str(data_dir), None, coordinator=None, extra=extra)
    return ServiceProcess(
        args,
        data_dir,
        f"store-{node_id}",
        listen=f"127.0.0.1:{port}",
        plaintext_health="--tls-cert" not in extra,
    )


_HANDED_OUT: set[int] = set()
EPHEMERAL_LOW_DEFAULT = 32_768
"""Linux's default lowest ephemeral port, where /proc does not say."""
DEV_UP_BASES = range(10_000, 20_000, 1000)
"""Where `dev up` clusters of tests take their ports (``dev_up.free_base_port``)."""
FREE_PORTS_FROM = DEV_UP_BASES.stop
"""``free_port`` hands out ports from here up to the ephemeral range."""


def ephemeral_low() -> int:
    """The lowest port the kernel gives an outgoing connection (or a bind to port 0)."""
    try:
        low = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0]
    except (OSError, IndexError):
        return EPHEMERAL_LOW_DEFAULT
    return int(low)


def share_of_this_test_worker(candidates: range) -> range:
    """The part of ``candidates`` this pytest-xdist worker takes (all of them without
    xdist). `make test` runs two workers at once: a probe sees a port another worker has
    bound, not one it has just probed and is about to bind, so each takes its own."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw0", "gw1", ...
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    index = int(name[2:]) if name.startswith("gw") else 0
    return candidates[index::count]


def free_port() -> int:
    """A loopback port free right now (for services whose address peers need upfront),
    never the same twice in one test run (the kernel may offer a just-closed port again),
    and below the ephemeral range: there, any outgoing connection of any process may take
    it between this probe and the service's bind (a coordinator of a fresh-clone CI run
    once found its port taken so)."""
    candidates = share_of_this_test_worker(range(FREE_PORTS_FROM, ephemeral_low()))
    rng = random.Random()
    for _ in range(1000):
        port = rng.choice(candidates) if len(candidates) > 1000 else 0
        try:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", port))
                port = int(probe.getsockname()[1])
        except OSError:
            continue
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError("no free loopback port")


def sync_coordinator(
    workdir: Path, node_id: str, store: str, port: int, peers: dict[str, int], *extra: str
) -> ServiceProcess:
    addresses = {peer: f"127.0.0.1:{peer_port}" for peer, peer_port in peers.items()}
    args = coordinator_args(node_id, store, None, peers=addresses, plaintext=False, extra=extra)
    return ServiceProcess(
        args,
        workdir,
        f"coordinator-{node_id}",
        listen=f"127.0.0.1:{port}",
        plaintext_health="--plaintext" in extra,
    )


def worker(
    data_dir: Path, worker_id: str = "w1", *extra: str, port: int = 0, postgres: str = ""
) -> ServiceProcess:
    """``port``: fixed, so that a restarted worker answers where dispatch dials it;
    ``postgres``: a conninfo to apply to PostgreSQL instead of SQLite in ``data_dir``."""
    data_dir.mkdir(parents=True, exist_ok=True)
    args = worker_args(worker_id, None, str(data_dir), None, postgres=postgres, extra=extra)
    return ServiceProcess(args, data_dir, f"worker-{worker_id}", listen=f"127.0.0.1:{port}")


def worker_dispatch(
    workdir: Path, store: str, workers: dict[str, str], *extra: str, port: int = 0
) -> ServiceProcess:
    """``port``: fixed, for a store that reads through this dispatch (``--dispatch``)."""
    workdir.mkdir(parents=True, exist_ok=True)
    args = dispatch_args(store, None, None, workers=workers, extra=extra)
    return ServiceProcess(args, workdir, "worker-dispatch", listen=f"127.0.0.1:{port}")
