"""Fault mixes the simulator can inject, parsed from ``--faults delay,drop,...``."""

from __future__ import annotations

from dataclasses import dataclass, fields

FAULT_NAMES = (
    "delay", "drop", "duplicate", "reorder", "partition", "flap", "crash", "membership",
)  # fmt: skip

DEFAULT_MIXES = (
    "none",
    "delay",
    "drop",
    "duplicate",
    "reorder",
    "partition",
    "flap",
    "crash",
    "delay,drop,duplicate,reorder,crash",
    "delay,drop,duplicate,reorder,partition,flap,crash",
    "membership",
    "delay,drop,duplicate,reorder,partition,flap,crash,membership",
)
"""What ``txsync sim`` runs when no ``--faults`` is given: each fault alone, then together."""


@dataclass(frozen=True, slots=True)
class FaultMix:
    delay: bool = False
    """WAN-like latency (5-80 ms one way) instead of a LAN's 1-5 ms."""
    drop: bool = False
    """Each message, body and fetch is lost with a per-seed probability up to 20%."""
    duplicate: bool = False
    """Each message is delivered twice with a per-seed probability up to 20%."""
    reorder: bool = False
    """Links are not FIFO: every message takes its own random delay."""
    partition: bool = False
    """The nodes split into two groups that cannot talk (a third of the time in one
    direction only), for 0.1-1.5 s, then heal, repeatedly."""
    flap: bool = False
    """Links flap every 10-60 ms: a single link cut one way, or a split, then healed."""
    crash: bool = False
    """Nodes crash (some between their durable writes and their sends) and restart."""
    membership: bool = False
    """Operators change the configuration through membership entries: a spare node is
    added, configured nodes are removed (never below three) or change weight."""

    @staticmethod
    def parse(text: str) -> FaultMix:
        """Parse ``"delay,drop"``; ``"none"`` or ``""`` is the fault-free mix."""
        names = [name.strip() for name in text.split(",") if name.strip()]
        if names == ["none"]:
            names = []
        unknown = sorted(set(names) - set(FAULT_NAMES))
        if unknown:
            raise ValueError(
                f"unknown fault(s) {', '.join(unknown)}; choose from {', '.join(FAULT_NAMES)}"
            )
        return FaultMix(**{name: True for name in names})

    @property
    def name(self) -> str:
        chosen = [f.name for f in fields(self) if getattr(self, f.name)]
        return ",".join(chosen) if chosen else "none"
