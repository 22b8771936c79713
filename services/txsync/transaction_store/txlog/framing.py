"""Frames: ``u32 length | u32 CRC-32 | payload`` (little endian), one per appended batch.

``scan`` walks a file's bytes and tells apart the two kinds of damage:

* a **torn tail**: the last frame is incomplete, or it is complete but fails its checksum
  and nothing follows it, or only zero bytes follow the last good frame. A crash during
  an append leaves exactly this; it is cut and reported.
* **corruption**: a bad frame with more data after it. No crash of ours produces that, so
  the store refuses to start and names the file and offset.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import BinaryIO

HEADER = struct.Struct("<II")
FRAME_PAYLOAD_BYTES_MAX = 64 * 1024 * 1024
"""A frame's payload is at most this big; a larger length field is damage."""


def encode_frame(payload: bytes | bytearray) -> bytes:
    assert 0 < len(payload) <= FRAME_PAYLOAD_BYTES_MAX, len(payload)
    return HEADER.pack(len(payload), zlib.crc32(payload)) + payload


def write_frame(out: BinaryIO, pieces: Iterable[bytes | bytearray]) -> int:
    """Write to ``out`` (seekable, at its end) the frame of the payload ``pieces`` make,
    taking one piece at a time; the bytes written. The header goes in place after the
    payload (its length and checksum are known then), so the payload is never held
    whole: a rotation's snapshot is megabytes. Only for a file no one reads until it is
    complete (a rotation's ``.tmp``): until the header is in place the frame is damage."""
    start = out.tell()
    out.write(bytes(HEADER.size))
    length = crc = 0
    for piece in pieces:
        crc = zlib.crc32(piece, crc)
        length += out.write(piece)
    assert 0 < length <= FRAME_PAYLOAD_BYTES_MAX, length
    end = out.tell()
    out.seek(start)
    out.write(HEADER.pack(length, crc))
    out.seek(end)
    return HEADER.size + length


@dataclass(frozen=True, slots=True)
class Scan:
    frames: list[tuple[int, bytes]]
    """(offset, payload) of every good frame."""
    good_end: int
    """Offset just past the last good frame."""
    torn_tail: str | None = None
    """Why the bytes from ``good_end`` on were a torn tail (None: the file is clean)."""
    corruption: str | None = None
    """Why the file is corrupt at ``good_end`` (None: it is not)."""


def scan(data: bytes) -> Scan:
    frames: list[tuple[int, bytes]] = []
    offset = 0
    size = len(data)
    while offset < size:
        remaining = size - offset
        if remaining < HEADER.size:
            return _damage(data, frames, offset, "an incomplete frame header")
        length, crc = HEADER.unpack_from(data, offset)
        if length == 0 or length > FRAME_PAYLOAD_BYTES_MAX:
            return _damage(data, frames, offset, f"an impossible frame length {length}")
        end = offset + HEADER.size + length
        if end > size:
            return _damage(data, frames, offset, f"a frame of {length} bytes cut short")
        payload = data[offset + HEADER.size : end]
        if zlib.crc32(payload) != crc:
            if end == size:
                return Scan(frames, offset, torn_tail="the last frame fails its checksum")
            return Scan(frames, offset, corruption="a frame fails its checksum")
        frames.append((offset, payload))
        offset = end
    return Scan(frames, offset)


def _damage(data: bytes, frames: list[tuple[int, bytes]], offset: int, what: str) -> Scan:
    """Damage that reaches the end of the file is a torn tail; anything else is not."""
    rest = data[offset:]
    if not rest.strip(b"\x00") or _no_frame_follows(data, offset):
        return Scan(frames, offset, torn_tail=what)
    return Scan(frames, offset, corruption=what)


def _no_frame_follows(data: bytes, offset: int) -> bool:
    """True if no well-formed frame starts after ``offset`` (the damage is the tail).

    A torn append can only leave one partial frame; if a checksum-valid frame starts
    somewhere after the damage, the damage is in the middle of the log.
    """
    size = len(data)
    for start in range(offset + 1, size - HEADER.size):
        length, crc = HEADER.unpack_from(data, start)
        end = start + HEADER.size + length
        plausible = 0 < length <= FRAME_PAYLOAD_BYTES_MAX and end <= size
        if plausible and zlib.crc32(data[start + HEADER.size : end]) == crc:
            return False
    return True
