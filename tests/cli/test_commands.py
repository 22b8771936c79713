"""The ``txsync`` command table: what ``--help`` lists without importing the commands."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from txsync.cli.main import COMMANDS, GRPC_EXPERIMENTS, build_parser, set_grpc_experiments


def _registered_summaries() -> dict[str, str]:
    parser = build_parser(every=True)
    (commands,) = (a for a in parser._actions if a.dest == "command")
    return {choice.dest: choice.help or "" for choice in commands._choices_actions}  # type: ignore[attr-defined]


def test_the_table_names_every_command_with_the_summary_its_module_registers() -> None:
    registered = _registered_summaries()
    assert registered == {name: summary for name, (_, summary) in COMMANDS.items()}


def test_every_command_prints_its_help() -> None:
    """In-process, each command's full parser formats its help (argparse formats help
    with %, and a limit in percent once crashed `txsync worker-dispatch --help`)."""
    parser = build_parser(every=True)
    (commands,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, subparser in commands.choices.items():
        assert subparser.format_help().startswith("usage: txsync " + name), name


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


def test_a_service_runs_on_the_poller_driven_grpc_transport_unless_told_otherwise() -> None:
    environ: dict[str, str] = {}
    set_grpc_experiments("transaction-store", environ)
    assert environ == {"GRPC_EXPERIMENTS": GRPC_EXPERIMENTS}
    chosen = {"GRPC_EXPERIMENTS": "event_engine_client"}
    set_grpc_experiments("worker", chosen)
    assert chosen == {"GRPC_EXPERIMENTS": "event_engine_client"}  # the user's choice
    for not_a_service in ("submit", "dev", None):
        untouched: dict[str, str] = {}
        set_grpc_experiments(not_a_service, untouched)
        assert untouched == {}


def test_the_variable_is_set_before_grpc_is_imported() -> None:
    probe = (
        "import os, sys\n"
        "import txsync.cli.main as cli\n"
        "before = 'grpc' in sys.modules\n"
        "try:\n"
        "    cli.main(['worker', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(before, 'grpc' in sys.modules, os.environ.get('GRPC_EXPERIMENTS'))\n"
    )
    environ = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    result = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True, text=True, check=True, timeout=60, env=environ,
    )  # fmt: skip
    assert result.stdout.strip().splitlines()[-1] == f"False True {GRPC_EXPERIMENTS}"


def test_the_installed_grpc_knows_the_experiments_the_services_turn_off() -> None:
    """gRPC only logs a name it does not know: an upgrade that drops the poller-driven
    transport would go unnoticed without this call over it."""
    probe = (
        "import asyncio, grpc\n"
        "async def echo(request, context):\n"
        "    return request\n"
        "async def main():\n"
        "    server = grpc.aio.server()\n"
        "    handler = grpc.unary_unary_rpc_method_handler(echo)\n"
        "    server.add_generic_rpc_handlers(\n"
        "        (grpc.method_handlers_generic_handler('probe.Echo', {'Call': handler}),))\n"
        "    port = server.add_insecure_port('127.0.0.1:0')\n"
        "    await server.start()\n"
        "    async with grpc.aio.insecure_channel(f'127.0.0.1:{port}') as channel:\n"
        "        answer = await channel.unary_unary('/probe.Echo/Call')(b'ping', timeout=30)\n"
        "    await server.stop(None)\n"
        "    print(answer.decode())\n"
        "asyncio.run(main())\n"
    )
    environ = {**os.environ, "GRPC_EXPERIMENTS": GRPC_EXPERIMENTS}
    result = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True, text=True, check=True, timeout=60, env=environ,
    )  # fmt: skip
    assert result.stdout.strip() == "ping"
    assert "Unknown experiment" not in result.stderr, result.stderr
