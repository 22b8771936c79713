"""Named maxima and timings of the protocol core (units last in every name).

Every queue, batch and message the core builds is bounded by one of these. The services
read them from configuration; the simulator uses the defaults or its own small values.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

MEMBERS_MAX = 16
"""Nodes in one configuration. Rounds cost O(members^2) messages, so this stays small."""

INCOMING_TXS_MOST = 65_536
"""The largest ``incoming_txs_max``. A view install may forget the whole incoming queue in
one step, and the store takes at most this many forgotten metas in one write
(``transaction_store.validation.FORGOTTEN_METAS_MAX``): past it the store would refuse
the install, and the coordinator would stop at every restart."""

EVENT_METAS_MOST = 4_096
"""The largest ``post_txs_max`` and ``catchup_entries_max``. One event appends at most
two such runs of metas to a store write (a catch-up message, then an ADD of the posts
held; ADDs chained by rebased posts take from the same posts), and the coordinator's shell
seals a write at 2,048, so a write stays within the store's 16,384 per step
(``PERSIST_METAS_MAX``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    incoming_txs_max: int = 65_536
    """Metas held in the incoming queue; foreign metas past it are learned later."""

    local_admit_txs_max: int = 4_096
    """A local transaction is refused (a stamped one waits in the store) while the
    incoming queue holds this many metas of this node. At most ``incoming_txs_max /
    MEMBERS_MAX``, so that every queue has room for the unsynced metas of every origin:
    ADD passes a meta only once every member posts it, and a full queue takes no foreign
    meta, so queues full of different metas stopped every ADD for good (docs/protocol.md,
    "Bounds"). A restarted core holds no more of its own than this either: its epoch
    keeps only the stamps that can have been posted (``transaction_store.state``).
    Not a limit on throughput: one ADD passes at most ``post_txs_max`` metas."""

    post_txs_max: int = 4_096
    """Metas in one POST. Cutting a post short is safe for the same reason as cutting it at
    the first unacquired body: every later post extends it below the cut."""

    catchup_entries_max: int = 1_024
    """Synced entries sent to a lagger in one message."""

    synced_window_max: int = 32_768
    """Synced entries the core keeps in memory; older ones are served from the txlog.
    Enough for a few rounds of full posts from every member (a post is rebased only
    from a base inside it); 100,000 made the coordinator's memory grow with the history
    up to that (18 MB of metas, issue 47)."""

    pending_fetches_max: int = 65_536
    """Bodies being fetched at once; bodies wanted beyond it wait their turn (in the
    order wanted), so it bounds the fetches in flight, not which bodies are fetched."""

    early_bodies_max: int = 4_096
    """Bodies acquired before their meta arrived that the core remembers."""

    def __post_init__(self) -> None:
        _check(self, _LIMIT_RULES)


@dataclass(frozen=True, slots=True, kw_only=True)
class Timing:
    round_timeout_ms: int = 500
    """A round whose posts are not all in by then ends empty (a member is missing)."""

    idle_interval_ms: int = 1_000
    """Gap between idle rounds (seed: 'once a second to once a minute')."""

    busy_round_gap_ms: int = 0
    """Least gap between the starts of two busy rounds (0: back to back, as the seed says)."""

    repost_gap_ms: int = 2
    """Least gap between two posts of one round. New knowledge (a local tx, merged metas,
    an acquired body, a raised counter) is re-posted at once within a round, which takes
    agreement from two round trips down to about one (PROTOCOL.md §6)."""

    body_fetch_delay_ms: int = 50
    """Wait for the origin's push before fetching a body ourselves."""

    body_fetch_retry_ms: int = 200
    """First retry gap of a body fetch; doubles per attempt up to the max."""

    body_fetch_retry_max_ms: int = 5_000

    catchup_resend_ms: int = 100
    """Least gap between two catch-up messages to the same lagger at the same base."""

    catchup_grace_ms: int = 100
    """How long a lagger whose post could be rebased is left to ADD by itself (its base
    not moving) before it is served catch-up. Such a post was sent before its sender heard
    of our ADD, and its queue begins with the entries we appended: the sender holds them
    and will most likely add them itself from the posts already on their way to it (about
    one round trip). Serving it at once sent the synced entries again: 40% of the bytes
    between DCs under load (measured, 4 x 50 per DC)."""

    exclusion_timeout_ms: int = 3_000
    """A view member heard nothing from for this long is excluded by a view change
    (PROTOCOL.md §3)."""

    view_change_timeout_ms: int = 2_000
    """A view change not installed by then is tried again with a higher ballot, by its
    proposer or by any member frozen by its promise."""

    view_change_stagger_ms: int = 200
    """Added per rank in the configuration to the two timeouts above, so that members
    that notice a silence together do not duel with equal ballots."""

    view_resend_ms: int = 200
    """Prepares and accepts are sent again at this gap to those that have not answered;
    also the least gap between two answers about views to the same node."""

    promise_wait_ms: int = 200
    """After a majority promised, how long the proposer waits for the rest, so that a
    slow but live member is not excluded."""

    def __post_init__(self) -> None:
        _check(self, _TIMING_RULES)


class SettingError(ValueError):
    """A limit or timing that cannot work; ``name`` is the field (the services turn it into
    their flag, ``--`` and dashes)."""

    def __init__(self, name: str, problem: str) -> None:
        super().__init__(f"{name} {problem}")
        self.name, self.problem = name, problem


Rule = tuple[str, Callable[[Any], bool], str]
"""(field, the condition it must meet, what to say when it does not)."""

_LIMIT_RULES: tuple[Rule, ...] = (
    ("incoming_txs_max", lambda s: s.incoming_txs_max <= INCOMING_TXS_MOST,
     f"must not exceed {INCOMING_TXS_MOST:,}"),
    ("post_txs_max", lambda s: s.post_txs_max <= EVENT_METAS_MOST,
     f"must not exceed {EVENT_METAS_MOST:,}"),
    ("catchup_entries_max", lambda s: s.catchup_entries_max <= EVENT_METAS_MOST,
     f"must not exceed {EVENT_METAS_MOST:,}"),
    ("local_admit_txs_max",
     lambda s: s.local_admit_txs_max * MEMBERS_MAX <= s.incoming_txs_max,
     f"must not exceed incoming_txs_max / {MEMBERS_MAX} (every queue holds every origin's)"),
    ("synced_window_max", lambda s: s.synced_window_max >= s.catchup_entries_max,
     "must be at least catchup_entries_max"),
)  # fmt: skip
_TIMING_RULES: tuple[Rule, ...] = (
    ("body_fetch_retry_ms", lambda s: s.body_fetch_retry_ms <= s.body_fetch_retry_max_ms,
     "must not exceed body_fetch_retry_max_ms"),
    ("promise_wait_ms", lambda s: s.promise_wait_ms < s.view_change_timeout_ms,
     "must be below view_change_timeout_ms"),
)  # fmt: skip
MAY_BE_ZERO = frozenset({
    "busy_round_gap_ms", "repost_gap_ms", "view_change_stagger_ms", "promise_wait_ms",
    "body_fetch_delay_ms",
})  # fmt: skip
"""Fields for which 0 means "none" (no gap, no wait); every other one must be positive."""


def _check(settings: Any, rules: tuple[Rule, ...]) -> None:
    """Raise ``SettingError`` for the first field out of bounds: a clear error that, unlike
    ``assert``, holds under ``python -O`` too."""
    for field in fields(settings):
        value = getattr(settings, field.name)
        least = 0 if field.name in MAY_BE_ZERO else 1
        if value < least:
            raise SettingError(
                field.name, "must be at least 0" if least == 0 else "must be positive"
            )
    for name, holds, problem in rules:
        if not holds(settings):
            raise SettingError(name, problem)
