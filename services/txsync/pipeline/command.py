"""``txsync pipeline <job>``: the data pipeline's jobs from the command line.

The same jobs run under ``spark-submit`` on a cluster, this file being the application
(Spark's usual form for Python): ``spark-submit --master spark://HOST:7077
$(python -m txsync.pipeline.command --path) export ...``; the session then runs on
spark-submit's master (``pipeline.session``). ``local[*]`` uses this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

EPILOG = """\
examples:
  txsync pipeline export --dc dc1=data/dc1 --dc dc2=data/dc2 --dc dc3=data/dc3 --out lake
  txsync pipeline export --endpoints data/cluster.json --out lake   # running DCs, rounds too
  txsync pipeline audit-order --data data --out lake       # every DC of a dev-up cluster
  txsync pipeline audit-order --parquet lake -o json
  txsync pipeline verify-replicas --data data           # every worker of every DC
  txsync pipeline report --data data --out report       # report/index.html
  txsync pipeline load --input rows.csv --columns id,name --rows-per-transaction 100 \\
      --sql 'INSERT INTO t (id, name) VALUES (?, ?)' --endpoints 127.0.0.1:7101,127.0.0.1:7201

exit status: 0 done (and, for audit-order, every DC agrees), 1 the DCs disagree,
2 bad arguments or unreadable input.
"""


LOCATION = "a path or a URI (file://, s3a://, hdfs://...), as Spark reads and writes them"
LOCAL = (
    "; a local path, read by each executor at that same path (shared storage, or "
    "--endpoints to read running DCs instead)"
)


def _dcs(options: argparse.Namespace) -> dict[str, Path]:
    """The DCs' data directories that ``--dc`` and ``--data`` name."""
    dcs = dict(options.dc)
    if options.data is not None:
        layout = options.data / "layout.json"
        try:
            known = json.loads(layout.read_text())["dcs"]
        except (OSError, ValueError, KeyError) as error:
            raise SystemExit(f"error: cannot read {layout}: {error}") from None
        dcs.update({dc: Path(entry["data"]) for dc, entry in known.items()})
    missing = [dc for dc, path in dcs.items() if not (path / "txlog").is_dir()]
    if missing:
        raise SystemExit(f"error: no txlog/ in the data directory of {', '.join(missing)}")
    return dcs


def _dc(text: str) -> tuple[str, Path]:
    dc, separator, path = text.partition("=")
    if not separator or not dc:
        raise argparse.ArgumentTypeError(f"{text!r} is not DC=DATA_DIR")
    return dc, Path(path)


def _replica(text: str) -> tuple[str, str]:
    name, separator, location = text.partition("=")
    if not separator or not name or not location:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=SQLITE_FILE or NAME=URI")
    return name, location


def _session(options: argparse.Namespace) -> Any:
    """The job's SparkSession (``pipeline.session``), its master said on stderr unless
    the answer is JSON (spark-submit sends the driver's stderr to its stdout)."""
    from txsync.pipeline.session import spark_session  # noqa: PLC0415 - pyspark is optional

    spark = spark_session(options.master)
    if getattr(options, "output", "text") != "json":
        print(f"(Spark master: {spark.sparkContext.master})", file=sys.stderr)
    return spark


def _log_sources(options: argparse.Namespace) -> list[Any]:
    """Where each DC's log is read: data directories (``--dc``, ``--data``) and running
    DCs' stores (``--endpoints``); exits with a message when none is given."""
    from txsync.cli.connect import targets_of, tls_of  # noqa: PLC0415
    from txsync.pipeline.export import LogSource  # noqa: PLC0415 - pyspark is optional

    sources = [LogSource(dc, directory=str(path)) for dc, path in _dcs(options).items()]
    if options.endpoints:
        tls = tls_of(options)
        sources += [
            LogSource(target.dc, store=target.address, token=options.token, tls=tls)
            for target in targets_of(options.endpoints)
        ]
    if not sources:
        raise SystemExit(
            "error: give --dc DC=DATA_DIR (repeat), --data DIR, or --endpoints "
            "(cluster.json or stores' HOST:PORT,...)"
            + (", or --parquet DIR" if hasattr(options, "parquet") else "")
        )
    return sources


def run_export(options: argparse.Namespace) -> int:
    from txsync.pipeline.export import export  # noqa: PLC0415 - pyspark is optional

    sources = _log_sources(options)
    started = time.monotonic()
    spark = _session(options)
    counts = export(spark, sources, options.out)
    print(
        f"exported {', '.join(f'{n} {name}' for name, n in counts.items())} rows of "
        f"{len(sources)} DCs to {options.out} in {time.monotonic() - started:.1f} s"
    )
    if counts["rounds"] == 0:
        print("(no rounds: coordinators keep them in memory; export with --endpoints)")
    return 0


def run_audit(options: argparse.Namespace) -> int:
    from txsync.pipeline.audit import audit_order  # noqa: PLC0415
    from txsync.pipeline.export import read_logs  # noqa: PLC0415
    from txsync.pipeline.uris import joined  # noqa: PLC0415

    if options.parquet is None:
        sources = _log_sources(options)
    spark = _session(options)
    if options.parquet is not None:
        synced = spark.read.parquet(joined(options.parquet, "synced"))
    else:
        synced = read_logs(spark, sources)["synced"]
    audit = audit_order(synced)
    report: dict[str, Any] = {
        "agrees": audit.agrees,
        "lengths": audit.lengths,
        "lag": audit.lag,
        "duplicates": audit.duplicates,
        "first_disagreement": None
        if audit.first_disagreement is None
        else {
            "position": audit.first_disagreement.position,
            "tx_ids": audit.first_disagreement.tx_ids,
        },
    }
    if options.output == "json":
        print(json.dumps(report, indent=2))
    else:
        for dc in sorted(audit.lengths):
            print(f"{dc}: {audit.lengths[dc]} synced, {audit.lag[dc]} behind the longest")
        if audit.first_disagreement is not None:
            where = audit.first_disagreement
            held = ", ".join(f"{dc} has {tx}" for dc, tx in sorted(where.tx_ids.items()))
            print(f"DISAGREE at position {where.position}: {held}")
        for dc, count in sorted(audit.duplicates.items()):
            print(f"DUPLICATES: {dc} holds {count} transaction(s) more than once")
        if audit.agrees:
            print(f"every DC agrees up to position {min(audit.lengths.values(), default=0)}")
    return 0 if audit.agrees else 1


def run_report(options: argparse.Namespace) -> int:
    from txsync.pipeline.export import SCHEMAS, read_logs  # noqa: PLC0415 - pyspark is optional
    from txsync.pipeline.report import write_report  # noqa: PLC0415
    from txsync.pipeline.uris import exists, joined  # noqa: PLC0415

    if options.parquet is None:
        log_sources = _log_sources(options)
    spark = _session(options)
    if options.parquet is not None:
        transitions = spark.read.parquet(joined(options.parquet, "transitions"))
        rounds_at = joined(options.parquet, "rounds")
        # Its schema given: an export of txlog files holds an empty rounds/ (no files).
        rounds = (
            spark.read.schema(SCHEMAS["rounds"]).parquet(rounds_at)
            if exists(spark, rounds_at)
            else None
        )
        sources = f"export {options.parquet}"
    else:
        datasets = read_logs(spark, log_sources)
        transitions, rounds = datasets["transitions"], datasets["rounds"]
        sources = "txlogs of " + ", ".join(
            f"{s.dc} ({s.directory})" if s.directory else f"the DC at {s.store}"
            for s in log_sources
        )
    report = write_report(transitions, options.out, sources, rounds)
    print(f"report: {report.page} ({len(report.plots)} plots; summary.json beside it)")
    return 0


def run_load(options: argparse.Namespace) -> int:
    from txsync.cli.connect import tls_of  # noqa: PLC0415
    from txsync.pipeline.load import (  # noqa: PLC0415 - pyspark is optional
        LoadPlan,
        default_key_prefix,
        load,
    )

    endpoints = tuple(e.strip() for e in options.endpoints.split(",") if e.strip())
    if not endpoints:
        print("error: give --endpoints HOST:PORT[,HOST:PORT...] (DCs' stores)", file=sys.stderr)
        return 2
    spark = _session(options)
    paths = list(options.input)
    if options.format == "csv":
        frame = spark.read.option("header", True).option("inferSchema", True).csv(paths)
    else:
        frame = spark.read.parquet(*paths)
    plan = LoadPlan(
        sql=options.sql,
        columns=tuple(c.strip() for c in options.columns.split(",")),
        endpoints=endpoints,
        key_prefix=options.key_prefix or default_key_prefix(spark, frame),
        rows_per_transaction=options.rows_per_transaction,
        batch=options.batch,
        token=options.token,
        tls=tls_of(options),
    )
    started = time.monotonic()
    try:
        result = load(spark, frame, plan)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    elapsed = time.monotonic() - started
    print(
        f"{result.rows:,} rows in {elapsed:.1f} s: {result.created:,} transactions created, "
        f"{result.existing:,} already there (an earlier run), {result.refused:,} refused"
    )
    for reason in result.errors:
        print(f"  refused: {reason}")
    return 0 if result.refused == 0 else 1


def run_verify(options: argparse.Namespace) -> int:
    from txsync.pipeline.replicas import (  # noqa: PLC0415 - pyspark is optional
        is_postgres,
        replicas_of_cluster,
        verify_replicas,
    )

    replicas: dict[str, Path | str] = dict(options.replica)
    if options.data is not None:
        replicas.update(replicas_of_cluster(options.data))
    if len(replicas) < 2:
        print("error: give two or more --replica NAME=SQLITE_FILE|POSTGRESQL_URI, or --data DIR",
              file=sys.stderr)  # fmt: skip
        return 2
    unreadable = [
        name
        for name, location in replicas.items()
        if not is_postgres(str(location)) and not Path(location).is_file()
    ]
    if unreadable:
        print(f"error: no database file for {', '.join(unreadable)}", file=sys.stderr)
        return 2
    started = time.monotonic()
    report = verify_replicas(_session(options), replicas)
    shown = report.differences.orderBy("replica", "table", "kind", "key").limit(options.show)
    listed = [row.asDict() for row in shown.collect()]
    if options.out is not None:
        report.differences.write.mode("overwrite").json(options.out)
    elapsed = time.monotonic() - started
    if options.output == "json":
        print(json.dumps({
            "equal": report.equal, "reference": report.reference, "rows": report.rows,
            "counts": [{"replica": r, "table": t, "kind": k, "count": n}
                       for (r, t, k), n in sorted(report.counts.items())],
            "differences": listed, "seconds": round(elapsed, 1),
        }, indent=2))  # fmt: skip
    else:
        total = sum(report.rows.values())
        print(f"{len(replicas)} replicas, {total} rows read, compared with "
              f"{report.reference} in {elapsed:.1f} s")  # fmt: skip
        for (replica, table, kind), count in sorted(report.counts.items()):
            print(f"  {replica} vs {report.reference}: {table}: {count} {kind}")
        for row in listed:
            print(f"  {row['kind'].upper()} {row['replica']} {row['table']} key {row['key']}")
        more = sum(report.counts.values()) - len(listed)
        if more > 0:
            print(f"  ... and {more} more (--out DIR writes them all)")
        if report.equal:
            print("every replica equals the reference")
    return 0 if report.equal else 1


def register(commands: Any) -> None:
    from txsync.cli.connect import add_tls_arguments  # noqa: PLC0415 - grpc, when used

    pipeline = commands.add_parser(
        "pipeline",
        help="data pipeline jobs on Spark (export, audit-order, verify-replicas, report, load)",
        description=__doc__.split("\n\n")[0],
    )
    jobs = pipeline.add_subparsers(dest="job", metavar="JOB", required=True)
    for name, handler, summary in (
        ("export", run_export, "DCs' txlogs -> Parquet (transactions, synced, transitions)"),
        ("audit-order", run_audit, "check that every DC holds the same synced order"),
        ("verify-replicas", run_verify, "compare every table of every worker by key"),
        ("report", run_report, "latency per step and DC, throughput, failures: HTML + plots"),
        ("load", run_load, "rows of CSV or Parquet -> transactions through the client API"),
    ):
        parser = jobs.add_parser(
            name, help=summary, description=summary[0].upper() + summary[1:] + ".",
            epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        )  # fmt: skip
        parser.add_argument(
            "--dc", type=_dc, action="append", default=[], metavar="DC=DIR",
            help=f"a DC's data directory (repeat){LOCAL}",
        )  # fmt: skip
        parser.add_argument(
            "--data", type=Path, help=f"a `txsync dev up` data directory (every DC in it){LOCAL}"
        )
        if name in ("export", "audit-order", "report"):
            parser.add_argument(
                "--endpoints", default="",
                help="running DCs read through their admin API instead: cluster.json or "
                     "stores' HOST:PORT,... (the only source of rounds)",
            )  # fmt: skip
        parser.add_argument(
            "--master",
            help="Spark master (default: spark-submit's --master when it runs the job, else "
                 "local[*], this machine's cores); given here, it wins over spark-submit's",
        )  # fmt: skip
        if name == "load":
            parser.add_argument("--input", nargs="+", required=True,
                                help="CSV (with a header) or Parquet files or folders: "
                                     f"{LOCATION}")  # fmt: skip
            parser.add_argument("--format", choices=("csv", "parquet"), default="csv")
            parser.add_argument("--sql", required=True, help="a statement with ? per column")
            parser.add_argument("--columns", required=True, help="the columns, in ? order")
            parser.add_argument("--endpoints", default="",
                                help="DCs' stores, HOST:PORT[,...] (spread over)")  # fmt: skip
            parser.add_argument("--rows-per-transaction", type=int, default=1,
                                help="rows in one transaction (1..1000, default 1)")  # fmt: skip
            parser.add_argument("--batch", type=int, default=100,
                                help="transactions per SubmitBatch (default 100)")  # fmt: skip
            parser.add_argument("--key-prefix", default="",
                                help="idempotency keys' prefix (default: load- and a "
                                     "digest of the input files' names, sizes and times, "
                                     "so a rerun of the same files resumes and a file "
                                     "rewritten at the same path loads anew)")  # fmt: skip
        if name in ("export", "audit-order", "report", "load"):
            connection = parser.add_argument_group(
                "connection (to stores: load, and --endpoints; read on the driver, sent "
                "to the executors)"
            )
            connection.add_argument(
                "--token", default=os.environ.get("TXSYNC_TOKEN", ""),
                help="bearer token, when the cluster requires one (default: $TXSYNC_TOKEN)",
            )  # fmt: skip
            add_tls_arguments(connection)
        if name == "export":
            parser.add_argument("--out", required=True,
                                help=f"where the Parquet datasets go: {LOCATION}")  # fmt: skip
        elif name == "report":
            parser.add_argument(
                "--out", type=Path, required=True,
                help="the report's directory (local: the driver writes it)",
            )  # fmt: skip
            parser.add_argument("--parquet", help=f"read an export instead: {LOCATION}")
        elif name == "verify-replicas":
            parser.add_argument(
                "--replica", type=_replica, action="append", default=[],
                metavar="NAME=FILE|URI",
                help="a worker's SQLite file or PostgreSQL URI (postgresql://...); repeat; "
                     "the first (by name) is the reference",
            )  # fmt: skip
            parser.add_argument("--out", help=f"write every difference (JSON lines): {LOCATION}")
            parser.add_argument("--show", type=int, default=50, help="differences to print")
            parser.add_argument("-o", "--output", choices=("text", "json"), default="text")
        else:
            parser.add_argument("--parquet", help=f"read an export instead of txlogs: {LOCATION}")
            parser.add_argument("-o", "--output", choices=("text", "json"), default="text")
        parser.set_defaults(handler=handler)


def main() -> int:
    """For ``spark-submit``: the same arguments as ``txsync pipeline``; ``--path`` alone
    prints this file's path (the application spark-submit takes)."""
    if sys.argv[1:] == ["--path"]:
        print(Path(__file__).resolve())
        return 0
    options = parse_arguments(sys.argv[1:])
    handler: Any = options.handler
    return int(handler(options))


def parse_arguments(arguments: Sequence[str]) -> argparse.Namespace:
    """A job's arguments (``audit-order --data ...``) as ``txsync pipeline`` parses them;
    exits with argparse's message if they are wrong."""
    parser = argparse.ArgumentParser(prog="txsync pipeline")
    register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["pipeline", *arguments])


if __name__ == "__main__":
    sys.exit(main())
