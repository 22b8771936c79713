"""Runs many seeded schedules per fault mix and reports them; used by ``txsync sim``."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from txsync.protocol import ProtocolNode
from txsync.sim.cluster import NodeFactory, ShellFactory, SimConfig, SimStats, Simulation
from txsync.sim.faults import FaultMix
from txsync.sim.invariants import InvariantViolation
from txsync.sim.workers import MachineFactory
from txsync.sync_coordinator.shell import Shell
from txsync.worker_dispatch.pipeline import PipelineMachine


@dataclass(frozen=True, slots=True)
class SeedOutcome:
    config: SimConfig
    stats: SimStats
    violation: str | None

    @property
    def ok(self) -> bool:
        return self.violation is None

    def replay_command(self) -> str:
        config = self.config
        return shlex.join(
            [
                "txsync", "sim",
                "--seed", str(config.seed),
                "--nodes", str(config.nodes),
                "--txs", str(config.txs),
                "--faults", config.faults.name,
                *([] if config.stamped_submits else ["--unstamped-submits"]),
                *(["--peer-hold-max", str(config.peer_hold_max)] if config.peer_hold_max else []),
            ]
        )  # fmt: skip


def run_seed(
    config: SimConfig,
    node_factory: NodeFactory | None = None,
    shell_factory: ShellFactory | None = None,
    machine_factory: MachineFactory | None = None,
) -> SeedOutcome:
    """One schedule; a broken core, shell or pipeline machine (tests/sim) replaces the
    real one if given."""
    simulation = Simulation(
        config,
        node_factory or ProtocolNode,
        shell_factory or Shell,
        machine_factory or PipelineMachine,
    )
    try:
        stats = simulation.run()
    except InvariantViolation as violation:
        simulation.stats.end_ms = simulation.stats.end_ms or -1
        return SeedOutcome(config, simulation.stats, f"step {simulation.stats.steps}: {violation}")
    return SeedOutcome(config, stats, None)


def _run_seed_default(config: SimConfig) -> SeedOutcome:
    return run_seed(config)


@dataclass(frozen=True, slots=True)
class MixSummary:
    mix: FaultMix
    seeds: int
    failures: tuple[SeedOutcome, ...]
    totals: SimStats
    """Every seed's counters summed (``SimStats.add``; ``views`` counts each view number
    once per seed, ``end_ms`` is the latest)."""

    def line(self, seconds: float) -> str:
        status = "OK" if not self.failures else f"{len(self.failures)} VIOLATION(S)"
        t = self.totals
        return (
            f"{self.mix.name:<52} {self.seeds:>6} seeds  {status:<14} "
            f"synced={t.synced} rounds={t.rounds} steps={t.steps} "
            f"crashes={t.crashes} dropped={t.dropped} views={t.views} "
            f"rotations={t.rotations} ({t.rotations_abandoned} abandoned) "
            f"fetch_calls={t.fetch_calls} ({t.fetch_calls_failed} failed) "
            f"dc_copies={t.dc_copies}  {seconds:.1f}s"
        )


def run_mix(
    mix: FaultMix,
    seeds: Iterator[int] | range,
    *,
    nodes: int,
    txs: int,
    jobs: int = 1,
    node_factory: NodeFactory | None = None,
    shell_factory: ShellFactory | None = None,
    machine_factory: MachineFactory | None = None,
    stop_at_first: bool = False,
    on_outcome: Callable[[SeedOutcome], None] | None = None,
    stamped_submits: bool = True,
    peer_hold_max: int = 0,
) -> MixSummary:
    configs = [
        SimConfig(
            seed=seed,
            nodes=nodes,
            txs=txs,
            faults=mix,
            stamped_submits=stamped_submits,
            peer_hold_max=peer_hold_max,
        )
        for seed in seeds
    ]
    outcomes: Iterator[SeedOutcome]
    broken = node_factory or shell_factory or machine_factory
    if jobs > 1 and not broken:
        pool = ProcessPoolExecutor(max_workers=jobs)
        outcomes = pool.map(_run_seed_default, configs, chunksize=16)
    else:
        pool = None
        outcomes = (
            run_seed(config, node_factory, shell_factory, machine_factory) for config in configs
        )
    failures: list[SeedOutcome] = []
    totals = SimStats()
    count = 0
    try:
        for outcome in outcomes:
            count += 1
            totals.add(outcome.stats)
            if on_outcome is not None:
                on_outcome(outcome)
            if not outcome.ok:
                failures.append(outcome)
                if stop_at_first:
                    break
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    return MixSummary(mix, count, tuple(failures), totals)
