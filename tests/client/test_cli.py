"""The CLI commands built on the library, against a real cluster: a retried submit at
another DC, a transaction found by its key, and a listing of every page."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

from tests.support.dev_up import txsync
from txsync.cli.submit_command import split_statements


def test_submit_twice_with_a_key_find_it_by_the_key_and_list_everything(
    cluster_file: Path,
) -> None:
    endpoints = ("--endpoints", str(cluster_file))
    table = f"cli_{uuid.uuid4().hex[:8]}"
    made = txsync("submit", *endpoints, "--sql", f"CREATE TABLE {table} (k INTEGER)",
                  "--wait", "ok")  # fmt: skip
    assert made.returncode == 0, made.stderr
    key = f"cli-{uuid.uuid4()}"
    insert = ("--sql", f"INSERT INTO {table} VALUES (?)", "--param", "1", "--key", key)
    first = txsync("submit", *endpoints, "--dc", "dc1", *insert, "--wait", "ok", "-o", "json")
    again = txsync("submit", *endpoints, "--dc", "dc2", *insert, "--wait", "ok", "-o", "json")
    assert first.returncode == 0 and again.returncode == 0, (first.stderr, again.stderr)
    one, two = json.loads(first.stdout), json.loads(again.stdout)
    assert two["tx_id"] == one["tx_id"] and two.get("duplicate") and two["dc"] == "dc2"
    found = txsync("tx", "get", "--key", key, *endpoints, "--dc", "dc1", "-o", "json")
    assert found.returncode == 0, found.stderr
    shown = json.loads(found.stdout)
    assert shown["tx_id"] == one["tx_id"] and shown["key"] == key
    assert [dc["node_id"] for dc in shown["dcs"]] == ["dc1", "dc2", "dc3"]
    counted = txsync("query", *endpoints, "--dc", "dc3", "--sql", f"SELECT count(*) FROM {table}",
                     "--after", one["tx_id"], "-o", "json")  # fmt: skip
    assert json.loads(counted.stdout)["rows"] == [[1]], counted.stderr
    page = txsync("tx", "list", *endpoints, "--limit", "2")
    assert page.returncode == 0 and "more: --page-token" in page.stderr
    listed = txsync("tx", "list", *endpoints, "--all", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    ids = [row["tx_id"] for row in json.loads(listed.stdout)]
    assert len(ids) == len(set(ids)) > 2 and one["tx_id"] in ids
    missing = txsync("tx", "get", "--key", f"never-{uuid.uuid4()}", *endpoints)
    assert missing.returncode == 1 and "no transaction submitted" in missing.stderr


def test_query_reads_a_named_worker_and_workers_shows_their_digests(cluster_file: Path) -> None:
    endpoints = ("--endpoints", str(cluster_file), "--dc", "dc3")
    for worker in ("dc3-w1", "dc3-w2"):
        read = txsync("query", *endpoints, "--worker", worker, "--sql", "SELECT 1", "-o", "json")
        assert read.returncode == 0, read.stderr
        assert json.loads(read.stdout)["worker"] == worker
    unknown = txsync("query", *endpoints, "--worker", "dc3-w9", "--sql", "SELECT 1")
    assert unknown.returncode == 1 and "no worker 'dc3-w9' in this DC" in unknown.stderr
    listed = txsync("workers", *endpoints, "-o", "json")
    digests = [w["state_digest"] for w in json.loads(listed.stdout)["dc3"]]
    assert len(digests) == 2 and all(len(d) == 64 for d in digests), listed.stdout


def test_a_reader_that_goes_away_ends_the_command_quietly(cluster_file: Path) -> None:
    """`txsync tx list --all | head -1`: the pipe closes under the command's output."""
    listing = subprocess.Popen(
        [sys.executable, "-m", "txsync.cli.main", "tx", "list", "--all",
         "--endpoints", str(cluster_file)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert listing.stdout is not None and listing.stderr is not None
    listing.stdout.close()  # before the command writes: as `head` does once it has its lines
    errors = listing.stderr.read().decode()
    assert listing.wait(timeout=60) in (0, 141)
    assert "Traceback" not in errors, errors


def test_a_file_of_statements_from_stdin_is_one_transaction_answered_at_accepted(
    cluster_file: Path,
) -> None:
    """``-f -``: the statements of stdin, split where SQLite ends one, go as one
    transaction; without --wait the command waits for ACCEPTED, as the library does."""
    table = f"cli_{uuid.uuid4().hex[:8]}"
    script = (
        f"CREATE TABLE {table} (k INTEGER PRIMARY KEY, v TEXT);\n"
        f"INSERT INTO {table} VALUES (1, 'a;b');  -- a ';' in a string\n"
        f"INSERT INTO {table} VALUES (2, 'c')"
    )
    made = subprocess.run(
        [sys.executable, "-m", "txsync.cli.main", "submit", "-f", "-",
         "--endpoints", str(cluster_file), "-o", "json"],
        input=script, capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    answer = json.loads(made.stdout)
    assert answer["reached"] and answer["state"] != "TX_STATE_INCOMING", answer
    shown = txsync("tx", "get", answer["tx_id"], "--endpoints", str(cluster_file), "-o", "json")
    assert shown.returncode == 0, shown.stderr
    assert len(json.loads(shown.stdout)["statements"]) == 3
    read = txsync("query", "--endpoints", str(cluster_file), "--after", answer["tx_id"],
                  "--sql", f"SELECT v FROM {table} ORDER BY k", "-o", "json")  # fmt: skip
    assert json.loads(read.stdout)["rows"] == [["a;b"], ["c"]], read.stderr
    mixed = txsync("submit", "-f", "-", "--param", "1", "--endpoints", str(cluster_file))
    assert mixed.returncode == 2 and "--param goes with --sql" in mixed.stderr


def test_statements_split_where_sqlite_ends_them() -> None:
    trigger = (
        "CREATE TRIGGER t_a AFTER INSERT ON t BEGIN UPDATE c SET n = n + 1; "
        "INSERT INTO log VALUES ('x;y'); END;"
    )
    text = f"CREATE TABLE t (a);\n{trigger}\n-- done;\n;\nINSERT INTO t VALUES (1)"
    assert split_statements(text) == ["CREATE TABLE t (a);", trigger, "INSERT INTO t VALUES (1);"]
    assert split_statements(" ;\n /* nothing; */ ; -- at all") == []
    assert split_statements("-- why\nDELETE FROM t") == ["-- why\nDELETE FROM t;"]
