"""MariaDB + Galera 4 (Debian's ``mariadb-server`` and ``galera-4``): N nodes on 127.0.0.1.

Each node is a ``mariadbd`` with its own data directory (initialised by
``mariadb-install-db``), run as the ``mysql`` user (the server refuses root), plaintext,
without grant tables (a benchmark user needs no accounts). Group communication between
nodes goes through the link emulator: every node listens for it on a port of its own and
*advertises* (``wsrep_node_address``) the emulator's port in front of it, so every node
reaches every other through a delayed link, whoever dials. The first node bootstraps the
cluster; the others join it and receive a state snapshot by rsync (SST).

Defaults stay durable like TxSync's txlog and etcd's WAL: InnoDB flushes its log at every
commit (``innodb_flush_log_at_trx_commit=1``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.peers import stop_processes
from tests.support.processes import free_port
from txsync.link_emulator import LinkEmulator, LinkSettings

PROVIDER = "/usr/lib/galera/libgalera_smm.so"
START_TIMEOUT_S = 120.0
PACKAGES = ("mariadb-server", "mariadb-client", "galera-4", "rsync")
WAN_USER_SEND_WINDOW = 512


@dataclass
class GaleraNode:
    name: str
    data: Path
    port: int
    """The SQL port clients use."""
    group_port: int
    """Where the node listens for group communication."""
    advertised_port: int = 0
    """The emulator's port in front of ``group_port``: what the other nodes dial."""
    process: subprocess.Popen[bytes] | None = None
    pid: int = 0


@dataclass
class GaleraCluster:
    root: Path
    size: int
    emulator: LinkEmulator
    one_way_delay_ms: float
    nodes: list[GaleraNode] = field(default_factory=list)

    def start(self) -> None:
        if not Path(PROVIDER).exists():
            raise RuntimeError(f"no Galera provider: apt-get install -y {' '.join(PACKAGES)}")
        self.root.mkdir(parents=True, exist_ok=True)
        shutil.chown(self.root, "mysql", "mysql")
        for n in range(self.size):
            node = GaleraNode(f"galera{n + 1}", self.root / f"node{n + 1}", free_port(),
                              free_port())  # fmt: skip
            settings = LinkSettings(delay_ms=self.one_way_delay_ms)
            node.advertised_port = self.emulator.add_link("*", node.name, node.group_port,
                                                          settings)  # fmt: skip
            self.nodes.append(node)
        for node in self.nodes:
            node.data.mkdir()
            shutil.chown(node.data, "mysql", "mysql")
            subprocess.run(
                ["mariadb-install-db", "--no-defaults", f"--datadir={node.data}",
                 "--user=mysql", "--auth-root-authentication-method=normal",
                 "--skip-test-db"],
                check=True, capture_output=True, timeout=120,
            )  # fmt: skip
        for index, node in enumerate(self.nodes):
            self._start_node(node, bootstrap=index == 0)
            self._wait_synced(node)

    def send_windows(self) -> list[str]:
        """Over a delayed link, the send windows MariaDB's reference advises for WAN
        (``evs.user_send_window``: "considerably higher, for example 512"; half of
        ``evs.send_window``); the LAN defaults (4 and 2 packets in flight) would hold
        Galera to a few replication messages per round trip (issue 52)."""
        if self.one_way_delay_ms <= 0:
            return []
        return [f"evs.send_window={2 * WAN_USER_SEND_WINDOW}",
                f"evs.user_send_window={WAN_USER_SEND_WINDOW}"]  # fmt: skip

    def _start_node(self, node: GaleraNode, *, bootstrap: bool) -> None:
        members = ",".join(f"127.0.0.1:{other.advertised_port}" for other in self.nodes)
        options = ";".join([
            f"gmcast.listen_addr=tcp://127.0.0.1:{node.group_port}",
            f"ist.recv_addr=127.0.0.1:{free_port()}",
            "gcache.size=64M",
            # WAN-sized timeouts, as Galera's guide advises for links of tens of ms.
            "evs.keepalive_period=PT1S", "evs.suspect_timeout=PT10S",
            "evs.inactive_timeout=PT30S", "evs.install_timeout=PT15S",
            *self.send_windows(),
        ])  # fmt: skip
        command = [
            "mariadbd", "--no-defaults", f"--datadir={node.data}", "--user=mysql",
            f"--port={node.port}", "--bind-address=127.0.0.1",
            f"--socket={node.data}/mysqld.sock", f"--pid-file={node.data}/mysqld.pid",
            f"--log-error={node.data}/error.log", "--skip-grant-tables",
            "--skip-name-resolve", "--innodb-buffer-pool-size=64M",
            "--innodb-log-file-size=48M", "--innodb-flush-log-at-trx-commit=1",
            "--binlog-format=ROW", "--default-storage-engine=InnoDB",
            "--innodb-autoinc-lock-mode=2", "--max-connections=500",
            "--wsrep-on=ON", f"--wsrep-provider={PROVIDER}",
            "--wsrep-cluster-name=txsync-bench", f"--wsrep-node-name={node.name}",
            f"--wsrep-node-address=127.0.0.1:{node.advertised_port}",
            f"--wsrep-cluster-address=gcomm://{'' if bootstrap else members}",
            f"--wsrep-provider-options={options}",
            "--wsrep-sst-method=rsync",
            f"--wsrep-sst-receive-address=127.0.0.1:{free_port()}",
            "--wsrep-slave-threads=2",
        ]  # fmt: skip
        node.process = subprocess.Popen(command, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)  # fmt: skip
        node.pid = node.process.pid

    def _wait_synced(self, node: GaleraNode) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert node.process is not None
            if node.process.poll() is not None:
                raise RuntimeError(f"{node.name} exited: see {node.data}/error.log")
            state = self.query(node, "SHOW STATUS LIKE 'wsrep_local_state_comment'")
            if state and state[0][1] == "Synced":
                return
            time.sleep(0.5)
        raise RuntimeError(f"{node.name} not Synced in {START_TIMEOUT_S:.0f} s: {node.data}")

    def query(self, node: GaleraNode, sql: str) -> list[tuple[str, ...]]:
        """Rows of ``sql`` run by the mariadb client; [] while the node cannot answer."""
        result = subprocess.run(
            ["mariadb", "--no-defaults", "-h", "127.0.0.1", "-P", str(node.port), "-u",
             "root", "-N", "-B", "-e", sql],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        if result.returncode != 0:
            return []
        return [tuple(line.split("\t")) for line in result.stdout.splitlines()]

    def execute(self, node: GaleraNode, sql: str) -> None:
        result = subprocess.run(
            ["mariadb", "--no-defaults", "-h", "127.0.0.1", "-P", str(node.port), "-u",
             "root", "-e", sql],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        if result.returncode != 0:
            raise RuntimeError(f"{node.name}: {sql}: {result.stderr.strip()}")

    def provider_options(self, node: GaleraNode, names: tuple[str, ...]) -> dict[str, str]:
        """``names`` as the node's Galera provider reports them (what it runs with)."""
        rows = self.query(node, "SHOW GLOBAL VARIABLES LIKE 'wsrep_provider_options'")
        if not rows:
            raise RuntimeError(f"{node.name} does not answer SHOW VARIABLES")
        # "name = value; name = value; ..." (some values are empty)
        pairs = (item.partition("=") for item in rows[0][1].split(";"))
        options = {name.strip(): value.strip() for name, _, value in pairs}
        return {name: options.get(name, "?") for name in names}

    def status_value(self, node: GaleraNode, name: str) -> int:
        rows = self.query(node, f"SHOW GLOBAL STATUS LIKE '{name}'")
        if not rows:
            raise RuntimeError(f"{node.name} does not answer SHOW STATUS")
        return int(rows[0][1])

    def stop(self) -> None:
        stop_processes((m.process for m in self.nodes), timeout_s=60)
        shutil.rmtree(self.root, ignore_errors=True)

    @property
    def pids(self) -> dict[str, int]:
        return {node.name: node.pid for node in self.nodes}


def main() -> None:
    """A quick look by hand: a 3-node cluster at 50 ms RTT, its status, then stop."""
    import tempfile  # noqa: PLC0415

    emulator = LinkEmulator()
    cluster = GaleraCluster(Path(tempfile.mkdtemp(prefix="galera-")), 3, emulator, 25.0)
    started = time.monotonic()
    try:
        cluster.start()
        print(f"up in {time.monotonic() - started:.1f} s")
        print(cluster.query(cluster.nodes[2], "SHOW STATUS LIKE 'wsrep_cluster_size'"))
        print(subprocess.run(["ss", "-tnp"], capture_output=True, text=True, check=False).stdout)
        for link in emulator.links.values():
            print(link.name, link.bytes_forwarded)
    finally:
        cluster.stop()
        emulator.close()
        os.sync()


if __name__ == "__main__":
    main()
