"""The deterministic simulator: a seeded cluster of protocol cores under injected faults,
with PROTOCOL.md §4 checked after every step. Around each core runs what the services
run: the coordinator's ``Shell``, the store's ``StoreState`` and rules (``step_rules.py``) and
dispatch's ``PipelineMachine`` (``workers.py``)."""

from txsync.sim.cluster import SIM_LIMITS, SIM_TIMING, SimConfig, SimStats, Simulation
from txsync.sim.faults import DEFAULT_MIXES, FAULT_NAMES, FaultMix
from txsync.sim.invariants import InvariantChecker, InvariantViolation
from txsync.sim.runner import MixSummary, SeedOutcome, run_mix, run_seed

__all__ = [
    "DEFAULT_MIXES",
    "FAULT_NAMES",
    "SIM_LIMITS",
    "SIM_TIMING",
    "FaultMix",
    "InvariantChecker",
    "InvariantViolation",
    "MixSummary",
    "SeedOutcome",
    "SimConfig",
    "SimStats",
    "Simulation",
    "run_mix",
    "run_seed",
]
