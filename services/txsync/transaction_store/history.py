"""A transaction's transitions as the store holds them: packed, 10 bytes a step.

Every record the store holds has a history of about five steps (INCOMING to OK). As a
list of ``Step`` objects, each with its own timestamp and service name, that was about
700 bytes of a finished record's 1,480 (``bench/record_cost.py`` over 2,284 records of a
soak's log; 956 bytes packed). ``History`` keeps the steps in one ``bytes`` (state, the
service's number, milliseconds) and makes a ``Step`` only when one is read; messages
are filled from ``fields`` without one. (It did not lower what a store keeps after a
long batched load, which pymalloc's spread sets: ``docs/benchmarks.md``, "Runs of
2026-12-02 12:45-13:47".)

Service names are numbered process-wide (``service_number``): the steps name the few
services that move transactions (the sync-coordinator, worker-dispatch, the store's
own submits), and a name is stored once, not once per step.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import overload

from txsync.protocol import TxState


@dataclass(frozen=True, slots=True)
class Step:
    """One transition in a transaction's history."""

    state: TxState
    at_unix_ms: int
    service: str


_PACKED = struct.Struct("<BBq")
"""A step: its state, its service's number, its time (milliseconds since the epoch)."""
STEP_BYTES = _PACKED.size
_STATES = {state.value: state for state in TxState}

SERVICES_NAMED_MOST = 255
"""Distinct service names a process numbers; any name after them is recorded as
``OTHER_SERVICE``. Steps come from TxSync's own services (the internal API, which
clients cannot call), a handful of names; the bound only keeps a misbehaving caller
from growing the table without end."""
OTHER_SERVICE = "another service"
_service_names: list[str] = [OTHER_SERVICE]
_service_numbers: dict[str, int] = {OTHER_SERVICE: 0}


def service_number(name: str) -> int:
    """``name``'s number in this process (the same name, the same number)."""
    number = _service_numbers.get(name)
    if number is None:
        if len(_service_names) >= SERVICES_NAMED_MOST:
            return _service_numbers[OTHER_SERVICE]
        number = len(_service_names)
        _service_names.append(name)
        _service_numbers[name] = number
    return number


def _packed(step: Step) -> bytes:
    return _PACKED.pack(step.state.value, service_number(step.service), step.at_unix_ms)


class History(Sequence[Step]):
    """A transaction's steps, oldest first: a ``Sequence[Step]`` that ``append`` grows.
    Equal to another history, or to a list of the same steps."""

    __slots__ = ("_packed",)

    def __init__(self, steps: Iterable[Step] = ()) -> None:
        self._packed = b"".join(_packed(step) for step in steps)

    @classmethod
    def _of_packed(cls, packed: bytes) -> History:
        history = cls()
        history._packed = packed
        return history

    def append(self, step: Step) -> None:
        # A new bytes object each time: a history grows about five times in its life,
        # and a bytearray would keep spare room in every record.
        self._packed += _packed(step)

    @property
    def last_state(self) -> TxState | None:
        """The newest step's state (None for no steps), without making a ``Step``."""
        if not self._packed:
            return None
        return _STATES[self._packed[-STEP_BYTES]]

    def fields(self) -> Iterator[tuple[int, int, str]]:
        """Each step as (its state's value, its milliseconds, its service), made without
        a ``Step`` or a ``TxState``: what a snapshot or an answer copies into a message
        (a ``Step`` each made building 2,284 records' snapshot forms 15% slower)."""
        names = _service_names
        for state, service, at_unix_ms in _PACKED.iter_unpack(self._packed):
            yield state, at_unix_ms, names[service]

    def __len__(self) -> int:
        return len(self._packed) // STEP_BYTES

    def __bool__(self) -> bool:
        return bool(self._packed)

    @overload
    def __getitem__(self, index: int) -> Step: ...

    @overload
    def __getitem__(self, index: slice) -> History: ...

    def __getitem__(self, index: int | slice) -> Step | History:
        if isinstance(index, slice):
            start, stop, stride = index.indices(len(self))
            if stride != 1:
                return History(list(self)[index])
            return History._of_packed(self._packed[start * STEP_BYTES : stop * STEP_BYTES])
        count = len(self)
        if index < 0:
            index += count
        if not 0 <= index < count:
            raise IndexError(f"step {index} of a history of {count}")
        return _unpacked(_PACKED.unpack_from(self._packed, index * STEP_BYTES))

    def __iter__(self) -> Iterator[Step]:
        return map(_unpacked, _PACKED.iter_unpack(self._packed))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, History):
            return self._packed == other._packed
        if isinstance(other, Sequence):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, as the list it replaces

    def __repr__(self) -> str:
        return f"History({list(self)!r})"


def _unpacked(fields: tuple[int, int, int]) -> Step:
    state, service, at_unix_ms = fields
    return Step(_STATES[state], at_unix_ms, _service_names[service])
