"""The worker's wire format: one JSON object per line each way, arrays in shared memory.

Shared by both sides, so it imports nothing from ct2_flash: the worker loads it by file path
next to stock ``ctranslate2``. Nor does it import numpy, which the worker does without: the
worker's start is on the path of a process's first call, and numpy's import was a large
share of it (docs/measurements.md, "Start-up"). A request names a shared-memory block and the shape of the float32 array in it; the other
side maps it without copying. JSON lines carry the small rest (prompts, tokens, options; their
cost: `bench/studies/stock_worker_overhead.py`, docs/measurements.md), and no array is ever pickled.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
from multiprocessing import resource_tracker, shared_memory
from typing import Dict, Set


def encode(message: dict) -> bytes:
    return (json.dumps(message, default=_plain) + "\n").encode("utf-8")


def _plain(value):
    """numpy scalars and arrays (callers pass them in options and tokens) as JSON values: both
    have ``tolist()`` (a scalar's gives the Python number)."""
    tolist = getattr(value, "tolist", None)
    if tolist is None:
        raise TypeError(f"{type(value).__name__} is not JSON serializable")
    return tolist()


def decode(line: bytes) -> dict:
    return json.loads(line.decode("utf-8"))


def _reserve(fd: int, size: int) -> None:
    """Allocate the pages of a shared-memory file now (where the system can say so)."""
    if not hasattr(os, "posix_fallocate"):  # macOS: no such call, and no size-limited /dev/shm
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as error:
        if error.errno in (errno.ENOSPC, errno.ENOMEM):
            raise
        # EOPNOTSUPP/EINVAL: a file system that cannot allocate ahead; left as before


class Blocks:
    """Shared-memory blocks mapped by name: each side keeps what it has seen open.

    Args:
        owner: this side created the blocks and unlinks them at ``close``; the other side
            only maps them (and keeps Python's resource tracker from unlinking them at exit).
    """

    def __init__(self, owner: bool) -> None:
        self.owner = owner
        self._open: Dict[str, shared_memory.SharedMemory] = {}
        self._linked: Set[str] = set()  # the owner's blocks that still have a name in /dev/shm

    def create(self, size: int) -> shared_memory.SharedMemory:
        """A new block of ``size`` bytes whose memory is there: ``OSError`` (ENOSPC) where
        /dev/shm cannot hold it (a container's is 64 MB by default). Only sized, a block would
        take its pages when first written, and a page that does not fit kills the writer with
        SIGBUS, this process or the worker."""
        block = shared_memory.SharedMemory(create=True, size=max(1, size))
        try:
            _reserve(block._fd, max(1, size))  # noqa: SLF001
        except OSError:
            block.close()
            block.unlink()
            raise
        self._open[block.name] = block
        self._linked.add(block.name)
        return block

    def map(self, name: str) -> shared_memory.SharedMemory:
        """Block ``name``, mapped here once (``FileNotFoundError`` for a name that is gone)."""
        block = self._open.get(name)
        if block is None:
            block = shared_memory.SharedMemory(name=name)
            if not self.owner:  # Python < 3.13 tracks mapped blocks too, and would unlink them
                resource_tracker.unregister(block._name, "shared_memory")  # noqa: SLF001
            self._open[name] = block
        return block

    def address(self, name: str, size: int) -> int:
        """Where block ``name`` is mapped in this process (valid until ``drop``), for ``size``
        bytes from its start: ``ValueError`` where the block is smaller."""
        block = self.map(name)
        if size > block.size:
            raise ValueError(f"block {name} holds {block.size} bytes, not {size}")
        view = ctypes.c_char.from_buffer(block.buf)
        try:
            return ctypes.addressof(view)
        finally:
            del view  # the buffer is exported while it lives, and the block could not be closed

    def __contains__(self, name: str) -> bool:
        return name in self._open

    def linked(self, name: str) -> bool:
        return name in self._linked

    def unlink(self, name: str) -> None:
        """The owner's block ``name`` loses its name: still mapped by whoever mapped it, gone
        from /dev/shm (and from Python's resource tracker) however the processes end."""
        if name in self._linked:
            self._linked.discard(name)
            self._open[name].unlink()

    def drop(self, name: str) -> None:
        """Unmap block ``name`` (and unlink it on the owner's side). Only once nothing reads it:
        a numpy view does not keep the mapping alive, and one read after the unmap crashes."""
        block = self._open.get(name)
        if block is not None:
            if self.owner:
                self.unlink(name)
            del self._open[name]
            block.close()

    def close(self) -> None:
        for name in list(self._open):
            self.drop(name)
