"""One declaration per setting (issue 18): its name, default, least value, unit, help and
what it bounds, in one place. From it come the command-line flag (with its check, a clear
argparse error naming the flag) and the rows of the table in docs/operations.md, which a
test compares with the docs, so that neither can drift from the code.

Declared here: the workers' limits (``WORKER_LIMITS``), the store's backpressure and log
size (``STORE_LIMITS``), worker-dispatch's feed (``DISPATCH_SETTINGS``), and the
coordinator's timings and limits
(``COORDINATOR_SETTINGS``: the protocol core's ``Timing`` and ``Limits``, whose defaults
and cross-field rules stay with the core).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

from txsync.protocol.limits import (
    EVENT_METAS_MOST,
    INCOMING_TXS_MOST,
    MAY_BE_ZERO,
    MEMBERS_MAX,
    Limits,
    Timing,
)
from txsync.worker.backend import (
    CONTENT_CHECK_EVERY_DEFAULT,
    GROWTH_BYTES_MAX_DEFAULT,
    HEAP_BYTES_MAX_DEFAULT,
    KEY_WINDOW_S_MOST,
    STATEMENT_TIMEOUT_MS_DEFAULT,
    STEPS_MAX_DEFAULT,
    VALUE_BYTES_MAX_DEFAULT,
)

MIB = 1024 * 1024

DC_COPY_BYTES_PER_S_DEFAULT = 32 * MIB
"""256 Mbit/s: a copy of a 10 GiB database to a DC starting from it takes about 5 min,
and leaves most of a 1 Gbit/s link between DCs to the rounds."""

INCOMING_TXS_MAX_DEFAULT = 32_768
UNFINISHED_TXS_MAX_DEFAULT = 8_192
UNPASSED_MAX_DEFAULT = 4_096
OPEN_BODY_BYTES_MAX_DEFAULT = 1 << 30
LOG_FILE_BYTES_MAX_DEFAULT = 16 << 20
LOG_FILE_ENTRIES_MAX_DEFAULT = 32_768
HISTORY_KEPT_DEFAULT = 2_000
HISTORY_KEPT_MS_DEFAULT = 10_000
BACKUPS_KEPT_DEFAULT = 2
PEER_HOLD_MAX_DEFAULT = 200_000
BODY_MISSING_ALARM_S_DEFAULT = 300
IDEMPOTENCY_WINDOW_S_DEFAULT = 3_600
"""The store's defaults (``StoreConfig`` takes them from here). The idempotency window
costs every worker a row per keyed transaction within it (~150 bytes with the client's
36-character keys, measured): an hour at 500 a second is 1.8M rows, ~270 MB."""
PROGRESS_REPORT_S = 0.25
"""How often the sync-coordinator (the peers' synced lengths) and worker-dispatch (the
workers' lowest position) report progress to their store (``ReportProgress``), which
truncates what all of them passed. The store truncates only as far as the
coordinator's core heard at the report before, so a report's period is history held at
the load's rate, and flow control (``--unpassed-max``) lets a burst run that much less
far: at 1 s a 150k soak loaded 1,698 transactions a second, at 0.25 s 2,019 (2,226
without flow control), store RSS 1.16x and 1.11x (``docs/benchmarks.md``, "Flow
control")."""
FOLLOW_GATHER_MS_MOST = 1_000
"""The longest pause a follower of the store's ``FollowEnqueued`` may ask for between two
messages (``FollowEnqueuedRequest.gather_ms``)."""
FEED_GATHER_MS_DEFAULT = 20
"""worker-dispatch's pause between the store's messages of its feed. At one client per DC
each transaction otherwise takes a feed message, an ``ApplyBatches`` round trip and an
``AdvanceStatesStream`` round trip of its own, each a wake-up of a sleeping process
(docs/benchmarks.md, Tuning 21 and 26). Whatever is ENQUEUED meanwhile goes in the next
message; the first after a quiet spell goes at once. The price: OK comes up to this
much later at low load; ACCEPTED, which clients wait for by default, not at all."""


@dataclass(frozen=True, slots=True)
class Setting:
    name: str
    """The option's destination (``options.<name>``); the flag is ``--`` and dashes."""
    default: int
    help: str
    """For ``--help``: what it is and what happens past it."""
    bounds: str
    """For the docs table: what it bounds."""
    unit: str = ""
    """``bytes`` (shown in MiB), ``ms``, ``steps``, ``positions``, ``files``..."""
    least: int = 1
    most: int | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def shown_default(self) -> str:
        if self.unit == "bytes" and self.default % MIB == 0:
            return f"{self.default // MIB} MiB"
        return f"{self.default:,}"

    def parse(self, text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < self.least:
            raise argparse.ArgumentTypeError(f"must be at least {self.least}, not {value}")
        if self.most is not None and value > self.most:
            raise argparse.ArgumentTypeError(f"must be at most {self.most:,}, not {value}")
        return value


WORKER_LIMITS: tuple[Setting, ...] = (
    Setting(
        "steps_max", STEPS_MAX_DEFAULT,
        "SQLite virtual-machine steps one transaction or read may take (about 2 s of one "
        "core at the default); past it the transaction is FAILED, naming this limit",
        "SQLite virtual-machine steps per transaction or read; counted, so deterministic",
        unit="steps",
    ),
    Setting(
        "value_bytes_max", VALUE_BYTES_MAX_DEFAULT,
        "the largest string or blob a statement may make",
        "the largest string or blob a statement may make (`SQLITE_LIMIT_LENGTH`)",
        unit="bytes",
    ),
    Setting(
        "growth_bytes_max", GROWTH_BYTES_MAX_DEFAULT,
        "how much one transaction may grow a SQLite database; past it the transaction is "
        "FAILED, naming this limit",
        "how much one transaction may grow a SQLite database (`PRAGMA max_page_count`)",
        unit="bytes",
    ),
    Setting(
        "touched_digest", 1,
        "1: SQLite workers hash the rows each transaction touched, so that dispatch finds a "
        "worker whose data differ at that very transaction (about 30 us of CPU per "
        "transaction, measured: make bench-apply-cost); 0: only the content check finds "
        "it, every --content-check-every positions. The same at every worker of the "
        "cluster (triggers change how SQLite orders a multi-row INSERT)",
        "SQLite: hash the rows each transaction touched and compare them at once (1), or "
        "leave it to the content check (0)",
        least=0, most=1,
    ),
    Setting(
        "heap_bytes_max", HEAP_BYTES_MAX_DEFAULT,
        "SQLite's memory in this worker process, reads included; a transaction needing "
        "more is FAILED, naming this limit",
        "SQLite's memory in the worker process, reads included (`PRAGMA hard_heap_limit`)",
        unit="bytes",
    ),
    Setting(
        "statement_timeout_ms", STATEMENT_TIMEOUT_MS_DEFAULT,
        "PostgreSQL: the time of one transaction's statements together (statement_timeout "
        "with what is left); timed, so a busy replica may differ and is then recovered from "
        "a snapshot",
        "PostgreSQL: one transaction's statements together (`statement_timeout`); timed, so "
        "a busy replica may differ and is recovered",
        unit="ms",
    ),
    Setting(
        "content_check_every", CONTENT_CHECK_EVERY_DEFAULT,
        "every N positions the state digest also covers all user data, so replicas whose "
        "data differ are caught (0: never); the same at every worker of the cluster",
        "every N positions the state digest covers all user data (0: never); the same at "
        "every worker",
        unit="positions", least=0,
    ),
)  # fmt: skip


STORE_LIMITS: tuple[Setting, ...] = (
    Setting(
        "incoming_max", INCOMING_TXS_MAX_DEFAULT,
        "refuse submits (RESOURCE_EXHAUSTED, with a retry hint) while this many "
        "transactions wait to be ordered",
        "transactions waiting to be ordered before submits are refused with a retry hint",
        unit="transactions",
    ),
    Setting(
        "unfinished_max", UNFINISHED_TXS_MAX_DEFAULT,
        "refuse submits (RESOURCE_EXHAUSTED, with a retry hint) while this many "
        "transactions wait to be ordered or are ordered and not yet OK or FAILED here (the "
        "workers' backlog, which the store holds in memory); clients fail over to another "
        "DC",
        "transactions waiting to be ordered or applied here before submits are refused "
        "(memory: about 3 KB each)",
        unit="transactions",
    ),
    Setting(
        "unpassed_max", UNPASSED_MAX_DEFAULT,
        "refuse submits (RESOURCE_EXHAUSTED, with a retry hint) while this many "
        "transactions, ordered or waiting to be, lie past what the slowest of the peer DCs "
        "in the view and this DC's workers passed (flow control: the store holds them in "
        "memory); 0: off",
        "transactions past what the slowest peer in the view or worker here passed before "
        "submits are refused (0: off)",
        unit="positions", least=0,
    ),
    Setting(
        "body_bytes_max", OPEN_BODY_BYTES_MAX_DEFAULT,
        "refuse submits while the bodies of unfinished transactions take this many bytes",
        "bytes of unfinished transactions' bodies before submits are refused",
        unit="bytes",
    ),
    Setting(
        "log_file_bytes_max", LOG_FILE_BYTES_MAX_DEFAULT,
        "rotate the txlog file (and truncate what every peer and worker passed) once this "
        "many bytes were appended since its snapshot",
        "bytes appended to the txlog file before it is rotated (and start-up work)",
        unit="bytes",
    ),
    Setting(
        "log_file_entries_max", LOG_FILE_ENTRIES_MAX_DEFAULT,
        "rotate the txlog file also once this many entries were appended since its "
        "snapshot: a start replays each (15-20 us; 32,768 add about 0.5 s to a start's "
        "0.5 s), and small entries (state changes) fill 16 MiB only after 100,000 or more",
        "entries appended to the txlog file before it is rotated (start-up replays them)",
        unit="entries",
    ),
    Setting(
        "history_kept", HISTORY_KEPT_DEFAULT,
        "truncation keeps at least this many of the newest synced positions (for tx get, "
        "waits and retried submits) although every peer and worker passed them",
        "newest finished transactions kept (memory: about 3 KB each); older ones every "
        "peer and worker passed are truncated, in place as they pass",
        unit="positions", least=0,
    ),
    Setting(
        "history_kept_ms", HISTORY_KEPT_MS_DEFAULT,
        "truncation also keeps every transaction finished within this many milliseconds "
        "(at most the newest 2,048 positions), so that a client reading one it just made "
        "finds it; waits find the verdicts of the 16,384 last truncated",
        "finished transactions kept by age, at most the newest 2,048 (memory: about 3 KB "
        "each); with --history-kept, the larger window holds",
        unit="ms", least=0,
    ),
    Setting(
        "peer_hold_max", PEER_HOLD_MAX_DEFAULT,
        "a peer DC that has not passed a position holds it (in memory and in the txlog) "
        "only while it is at most this many positions behind the synced end; one further "
        "behind is let go (txsync status warns) and starts from another DC's copy when "
        "back; 0: no bound, a DC down for long holds its peers' history for as long",
        "positions a peer DC behind may hold back from truncation (memory: about 3 KB "
        "each); one further behind starts from a copy of another DC; 0: no bound",
        unit="positions", least=0,
    ),
    Setting(
        "body_missing_alarm_s", BODY_MISSING_ALARM_S_DEFAULT,
        "raise an alarm (the DC unhealthy) once the first synced transaction whose body "
        "is not here has waited this many seconds for it: its workers stop there",
        "seconds the first body this DC lacks may wait before its status raises an alarm",
        unit="s",
    ),
    Setting(
        "backups_kept", BACKUPS_KEPT_DEFAULT,
        "bak- files (retired log files, read by the pipeline's export) kept in the txlog "
        "directory; a rotation deletes older ones",
        "retired txlog files (`bak-*.dat`) kept; older ones are deleted at rotation",
        unit="files", least=0,
    ),
    Setting(
        "idempotency_window_s", IDEMPOTENCY_WINDOW_S_DEFAULT,
        "every worker of every DC remembers the idempotency key of a submit taken here for "
        "this long after this DC took it, besides the 262,144 positions after it (the "
        "longer wins): a retry with the key within it, at any DC, runs nothing. Costs each "
        "worker's database about 150 bytes per keyed transaction within it (every client "
        "submit has a key); 0: positions only",
        "how long every worker remembers the keys of submits taken here, besides 262,144 "
        "positions (each worker's database: ~150 bytes per keyed transaction within it)",
        unit="s", least=0, most=KEY_WINDOW_S_MOST,
    ),
)  # fmt: skip


DISPATCH_SETTINGS: tuple[Setting, ...] = (
    Setting(
        "feed_gather_ms", FEED_GATHER_MS_DEFAULT,
        "after each message of the store's feed of ordered transactions, wait this long "
        "so that what is ordered meanwhile reaches the workers as one batch (fewer "
        "messages and wake-ups at low load; OK comes up to this much later); 0: no wait",
        "pause between the store's messages to the workers' feed (batches at low load; "
        "OK up to this much later)",
        unit="ms", least=0, most=FOLLOW_GATHER_MS_MOST,
    ),
    Setting(
        "disk_free_alarm_percent", 10,
        "warn (ListWorkers, txsync status) while a worker's disk has less than this "
        "percentage free; a warning leaves the DC healthy; 0: never",
        "warn while a worker's disk has less than this percentage free",
        unit="%", least=0, most=100,
    ),
    Setting(
        "database_bytes_alarm", 0,
        "warn (ListWorkers, txsync status) while a worker's database is larger than "
        "this; 0: never",
        "warn while a worker's database is larger than this (0: never)",
        unit="bytes", least=0,
    ),
)  # fmt: skip


def _core(
    name: str,
    unit: str,
    help_text: str,
    bounds: str = "",
    *,
    most: int | None = None,
    least: int | None = None,
) -> Setting:
    """A field of the core's ``Timing`` or ``Limits``, with its default and least value
    (the largest, where there is one, is the core's too: ``protocol.limits``)."""
    default = getattr(Timing(), name, None)
    if default is None:
        default = getattr(Limits(), name)
    if least is None:
        least = 0 if name in MAY_BE_ZERO else 1
    return Setting(name, default, help_text, bounds or help_text, unit=unit, least=least, most=most)


COORDINATOR_SETTINGS: tuple[Setting, ...] = (
    _core("round_timeout_ms", "ms", "a round without every peer's post ends empty after this"),
    _core("idle_interval_ms", "ms", "gap between idle rounds"),
    _core("busy_round_gap_ms", "ms", "least gap between busy rounds (0: back to back)"),
    _core("repost_gap_ms", "ms", "least gap between two posts of one round"),
    _core("body_fetch_delay_ms", "ms", "wait for the origin's push before fetching a body"),
    _core("body_fetch_retry_ms", "ms", "first retry gap of a body fetch (doubles)"),
    _core("body_fetch_retry_max_ms", "ms", "longest retry gap of a body fetch"),
    _core("catchup_resend_ms", "ms", "least gap between catch-ups to one lagger"),
    _core("catchup_grace_ms", "ms",
          "a lagger whose post could be rebased is served catch-up only after this"),
    _core("exclusion_timeout_ms", "ms", "a member silent this long is excluded by a view change"),
    _core("view_change_timeout_ms", "ms", "a view change not installed by then is tried again"),
    _core("view_change_stagger_ms", "ms",
          "added per rank to the two above, so proposers do not duel"),
    _core("view_resend_ms", "ms",
          "gap between resent prepares/accepts, and between view answers"),
    _core("promise_wait_ms", "ms", "after a majority promised, wait this long for the others"),
    _core("incoming_txs_max", "metas",
          "metas held in the incoming queue (at most 65,536, what one view change may "
          "forget; the same at every DC); past 4,096 or 1/16 of this of its own, "
          "whichever is less, local submits wait in the store until there is room",
          most=INCOMING_TXS_MOST, least=MEMBERS_MAX),
    _core("post_txs_max", "metas", "metas in one post (at most 4,096)", most=EVENT_METAS_MOST),
    _core("catchup_entries_max", "entries",
          "synced entries in one catch-up message (at most 4,096)", most=EVENT_METAS_MOST),
    _core("synced_window_max", "entries",
          "synced entries kept in memory (older ones come from the txlog)"),
    Setting(
        "dc_copy_bytes_per_s", DC_COPY_BYTES_PER_S_DEFAULT,
        "a copy of this DC's testing worker sent to a DC that starts from it (added, or "
        "let go past --peer-hold-max) goes at most this fast, in bytes per second, so it "
        "leaves the link between DCs to the rounds; 0: as fast as the link takes it",
        "bytes per second of a copy sent to a DC starting from it (0: not paced)",
        unit="bytes", least=0,
    ),
)  # fmt: skip


def add_arguments(group: argparse._ArgumentGroup, settings: Sequence[Setting]) -> None:
    for setting in settings:
        unit = "" if setting.unit == "bytes" else f" {setting.unit}"
        group.add_argument(
            setting.flag,
            type=setting.parse,
            default=setting.default,
            metavar=(setting.unit or "n").upper(),
            # argparse formats help with %: a unit of "%" crashed `--help`.
            help=f"{setting.help} (default {setting.shown_default}{unit})".replace("%", "%%"),
        )


def docs_rows(settings: Sequence[Setting]) -> list[str]:
    """The settings as rows of docs/operations.md's table (flag, default, what it bounds)."""
    return [f"| `{s.flag}` | {s.shown_default} | {s.bounds} |" for s in settings]
