"""The ``txsync`` command table: what ``--help`` lists without importing the commands."""

from __future__ import annotations

import subprocess
import sys

from txsync.cli.main import COMMANDS, build_parser


def _registered_summaries() -> dict[str, str]:
    parser = build_parser(every=True)
    (commands,) = (a for a in parser._actions if a.dest == "command")
    return {choice.dest: choice.help or "" for choice in commands._choices_actions}  # type: ignore[attr-defined]


def test_the_table_names_every_command_with_the_summary_its_module_registers() -> None:
    registered = _registered_summaries()
    assert registered == {name: summary for name, (_, summary) in COMMANDS.items()}


def test_help_and_a_client_command_import_no_service_or_kubernetes_code() -> None:
    probe = (
        "import sys\n"
        "from txsync.cli.main import main\n"
        "for argv in (['--help'], ['submit', '--help']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "heavy = ('kubernetes', 'psycopg', 'txsync.sim', 'opentelemetry.exporter',\n"
        "         'txsync.transaction_store', 'txsync.sync_coordinator', 'pyspark')\n"
        "print(sorted(m for m in sys.modules if m.startswith(heavy)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip().splitlines()[-1] == "[]", result.stdout
