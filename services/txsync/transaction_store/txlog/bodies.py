"""Transaction bodies on disk: ``transactions/<first 3 hex>/<uuid>.pb.gz`` (the seed's
layout). Each file holds one gzip-compressed, serialized ``TxBody``.

A body is written to a temporary file, fsynced, renamed into place and its directory
fsynced, so a crash leaves either the whole body or none (stray ``.tmp`` files are
removed at start-up). The digest is SHA-256 of the uncompressed encoded body.
"""

from __future__ import annotations

import gzip
import hashlib
import os
from pathlib import Path

BODY_EXT = "pb"
GZIP_LEVEL = 1
"""Fast compression: bodies are written on every submit's critical path."""


def body_digest(encoded: bytes) -> bytes:
    return hashlib.sha256(encoded).digest()


class BodyStore:
    def __init__(self, root: Path) -> None:
        self._root = root
        root.mkdir(parents=True, exist_ok=True)
        for stray in root.glob("*/*.tmp"):
            stray.unlink()

    def path(self, tx_id: str) -> Path:
        return self._root / tx_id[:3] / f"{tx_id}.{BODY_EXT}.gz"

    def write(self, tx_id: str, encoded: bytes) -> None:
        """Durably store ``encoded`` (a serialized TxBody); overwrites an earlier copy."""
        final = self.path(tx_id)
        directory = final.parent
        if not directory.exists():
            directory.mkdir(parents=True, exist_ok=True)
            _fsync_dir(self._root)
        temporary = final.with_suffix(".tmp")
        with open(temporary, "wb") as out:
            out.write(gzip.compress(encoded, compresslevel=GZIP_LEVEL, mtime=0))
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, final)
        _fsync_dir(directory)

    def read(self, tx_id: str) -> bytes | None:
        """The encoded body, or None if not held (or unreadable, which is reported)."""
        try:
            with open(self.path(tx_id), "rb") as source:
                return gzip.decompress(source.read())
        except FileNotFoundError:
            return None

    def holds(self, tx_id: str) -> bool:
        return self.path(tx_id).exists()

    def delete(self, tx_id: str) -> None:
        self.path(tx_id).unlink(missing_ok=True)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
