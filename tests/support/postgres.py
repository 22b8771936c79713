"""A throwaway PostgreSQL cluster for tests, from Debian's packages (initdb + pg_ctl).

PostgreSQL refuses to run as root, and CI runs as root: the data directory is then owned
by the ``postgres`` user and the server runs as that user (``runuser``). The server listens
on a free loopback port and a socket in its own directory, trusts local connections, and
is stopped (fast) at the end. ``.ci/run`` installs the ``postgresql`` package when the
machine lacks it; without it these tests fail, naming the package, instead of skipping.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.support.processes import free_port

START_TIMEOUT_S = 60


def _binaries() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        raise RuntimeError(
            "PostgreSQL is not installed: apt-get install -y postgresql (.ci/run does this)"
        )
    return Path(found[-1]).parent


class PostgresServer:
    def __init__(self) -> None:
        self.bin = _binaries()
        # Its own directory under /tmp: pytest's are private to root, which the postgres
        # user could not enter.
        self.root = Path(tempfile.mkdtemp(prefix="txsync-postgres-"))
        self.data = self.root / "pgdata"
        self.port = free_port()
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            shutil.chown(self.root, "postgres", "postgres")
        self._run(str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust",
                  "-U", "postgres", "-E", "UTF8", "--no-sync")  # fmt: skip
        options = f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1 -c fsync=off"
        log = str(self.data / "server.log")
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-o", options, "-l", log,
                  "-w", "-t", str(START_TIMEOUT_S), "start")  # fmt: skip
        self._databases = 0

    def _run(self, *command: str) -> None:
        prefix = ["runuser", "-u", "postgres", "--"] if self._as_postgres else []
        subprocess.run([*prefix, *command], check=True, capture_output=True)

    def conninfo(self, dbname: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={dbname}"

    @staticmethod
    def uri(conninfo: str) -> str:
        """The ``postgresql://`` URI of one of this server's conninfo strings."""
        parts = dict(item.split("=", 1) for item in conninfo.split())
        return f"postgresql://{parts['user']}@{parts['host']}:{parts['port']}/{parts['dbname']}"

    def new_database(self) -> str:
        """A fresh, empty database; returns its conninfo."""
        import psycopg  # imported here: only PostgreSQL tests need it

        self._databases += 1
        name = f"t{self._databases}"
        with psycopg.connect(self.conninfo(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.conninfo(name)

    def stop(self) -> None:
        try:
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
