"""The worker's one batching scheduler: ``generate()`` requests that can share a call run as one.

Threads sharing a model (faster-whisper's ``num_workers``, a server's concurrent requests,
``ct2-flash transcribe``'s files in flight, several streams' re-decodes) send the worker one
request per window. Every request waits in one queue (``Batches``) for a serving thread, as
before; a thread that takes a ``generate()`` request also takes every later one waiting that
could run in the same ``generate()`` call (``batch_key``), up to ``max_rows`` rows, and the
worker runs them as one call over their stacked encoder outputs. Each request gets its own rows'
results, in its own order (``split``).

Why this is exact: stock CTranslate2 decodes the rows of a batch independently, and on the CPUs
measured its int8 kernels give each row the same tokens and the same scores, bit for bit,
whatever the other rows are (``bench/batch_invariance.py``; the worker checks the CPU it runs on
before it first batches: ``worker.batch_invariant``). CTranslate2 runs a batch's prompts in one
pass without a mask, so it refuses rows whose ``<|startoftranscript|>`` sits at different
indices or whose task tokens differ in number; padding or cutting a prompt to fit would change
the output, so such rows are simply never batched together. Nor are rows with other options.

No request waits for partners it does not have: one alone in the queue runs at once. A request
finds partners because the engine was busy when it came (the queue filled meanwhile), or, with
``wait_seconds`` > 0, waits up to that long for them while other requests are being served (their
callers may send a ``generate()`` soon). Sampled calls are batched only where the worker is not
seeded: a seeded sequence of draws is each call's alone.

Shared with nothing else: the worker loads this file by path, next to stock ``ctranslate2``, so
it imports nothing from ct2_flash, nor numpy.
"""

from __future__ import annotations

import ctypes
import json
import threading
import time
from collections import deque
from typing import Deque, List, Optional, Sequence, Tuple

# The option that makes a call sample (CTranslate2's default 1 takes the best token).
_SAMPLING_TOPK = "sampling_topk"


def batch_key(request: dict, rows: int, sot: Optional[int], seeded: bool) -> Optional[tuple]:
    """What a ``generate()`` request must share with another to run in one call with it, or
    None where it runs alone: another op, no start-of-transcript token known, prompts that do
    not all share one layout, an encoder output with another number of rows than prompts, or
    sampling on a seeded worker.

    Args:
        request: the request as the client sent it ("op", "prompts", "options").
        rows: rows of its encoder output.
        sot: the id of ``<|startoftranscript|>`` in the model's vocabulary, or None.
        seeded: whether the worker's sampling is seeded.
    """
    if request.get("op") != "generate" or sot is None:
        return None
    prompts = request["prompts"]
    options = request.get("options") or {}
    if rows != len(prompts) or not prompts:
        return None
    if seeded and options.get(_SAMPLING_TOPK, 1) != 1:
        return None
    layouts = {_layout(prompt, sot) for prompt in prompts}
    if len(layouts) != 1 or None in layouts:
        return None
    return (layouts.pop(), json.dumps(options, sort_keys=True))


def _layout(prompt: Sequence, sot: int) -> Optional[Tuple[int, int]]:
    """(index of the first ``<|startoftranscript|>``, tokens from it to the end), or None where
    the prompt has none or is given as token strings (CTranslate2's check, ``check_prompts``)."""
    if any(not isinstance(token, int) for token in prompt):
        return None
    try:
        index = list(prompt).index(sot)
    except ValueError:
        return None
    return index, len(prompt) - index


def split(results: list, rows: Sequence[int]) -> List[list]:
    """A batched call's ``results`` (one per row), as each request's own: ``rows[i]`` of them for
    request ``i``, in order."""
    parts, start = [], 0
    for count in rows:
        parts.append(results[start : start + count])
        start += count
    return parts


class Batches:
    """The worker's queue: requests in the order they came, taken by serving threads one at a
    time or, for ``generate()`` requests that share a ``batch_key``, many at a time.

    Args:
        key: ``item -> batch key or None`` (the worker's ``batch_key`` of a queued item).
        rows: ``item -> rows it decodes``.
        max_rows: the most rows one call decodes (1: no batching).
        wait_seconds: how long a request that found fewer partners than ``max_rows`` allows may
            wait for more, while other requests are being served (0: never).
        threads: the serving threads (the model's replicas): where several are idle, the
            requests waiting are shared between them, not all taken by the first.
    """

    def __init__(self, key, rows, max_rows: int = 1, wait_seconds: float = 0.0, threads: int = 1) -> None:
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows!r}")
        if wait_seconds < 0:
            raise ValueError(f"wait_seconds must be >= 0, got {wait_seconds!r}")
        self._key, self._rows = key, rows
        self.max_rows, self.wait_seconds, self.threads = max_rows, wait_seconds, max(1, threads)
        self._items: Deque = deque()
        self._ready = threading.Condition()
        self._serving = 0  # items taken and not done: their callers may send more soon
        self._stopped = False

    def put(self, item) -> None:
        with self._ready:
            self._items.append(item)
            self._ready.notify_all()  # a thread waiting for partners as well as an idle one

    def stop(self) -> None:
        """No more items: every one queued is still taken, then ``take`` returns None."""
        with self._ready:
            self._stopped = True
            self._ready.notify_all()

    def take(self) -> Optional[list]:
        """The next items to run as one call: the oldest, with the later ones that share its
        key (up to ``max_rows`` rows); None once stopped and empty. Call ``done`` after."""
        with self._ready:
            while not self._items:
                if self._stopped:
                    return None
                self._ready.wait()
            first = self._items.popleft()
            taken = [first]
            key = self._key(first) if self.max_rows > 1 else None
            if key is not None:
                rows = self._gather(key, taken, self._rows(first), self._share(key, self._rows(first)))
                deadline = time.monotonic() + self.wait_seconds
                while rows < self.max_rows and self._serving > 0 and not self._stopped:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._ready.wait(left)
                    rows = self._gather(key, taken, rows, self.max_rows)
            self._serving += 1
            return taken

    def done(self) -> None:
        """The items of the last ``take`` are answered."""
        with self._ready:
            self._serving -= 1
            self._ready.notify_all()

    def _share(self, key, rows: int) -> int:
        """The rows this thread takes of those waiting with ``key`` (``rows`` of them taken
        already): all, up to ``max_rows``, unless other serving threads are idle, which then
        take an equal share each (the lock is held)."""
        waiting = rows + sum(self._rows(item) for item in self._items if self._key(item) == key)
        idle = max(1, self.threads - self._serving)
        return min(self.max_rows, -(-waiting // idle))

    def _gather(self, key, taken: list, rows: int, cap: int) -> int:
        """Move the queued items with ``key`` that fit in ``cap`` rows into ``taken`` (the lock
        is held)."""
        kept: Deque = deque()
        while self._items:
            item = self._items.popleft()
            more = self._rows(item)
            if rows + more <= cap and self._key(item) == key:
                taken.append(item)
                rows += more
            else:
                kept.append(item)
        self._items = kept
        return rows


FLOAT32 = "<f4"  # numpy's array-interface name of little-endian float32


class Float32Array:
    """A C-contiguous float32 array of ``shape`` at ``address``, as ``StorageView.from_array``
    reads one (the array interface), without numpy (the worker never imports it, to start
    sooner: ``protocol``'s docstring). ``owner``, if given, is kept alive with it."""

    def __init__(self, address: int, shape, owner=None) -> None:
        self.owner = owner
        self.__array_interface__ = {
            "shape": tuple(int(n) for n in shape),
            "typestr": FLOAT32,
            "data": (address, False),
            "strides": None,
            "version": 3,
        }


def stacked(outputs: Sequence) -> Float32Array:
    """The encoder outputs ``outputs`` (float32 CPU StorageViews [rows, frames, d_model] with the
    same frames and width) as one array of all their rows, in order: a copy, which the caller
    keeps alive while the engine reads it."""
    shapes = [tuple(output.__array_interface__["shape"]) for output in outputs]
    if any(output.__array_interface__["typestr"] != FLOAT32 for output in outputs):
        raise TypeError("the encoder outputs are not float32")
    if len({shape[1:] for shape in shapes}) != 1:
        raise ValueError(f"encoder outputs of different shapes cannot be stacked: {shapes}")
    row = 1
    for n in shapes[0][1:]:
        row *= n
    rows = sum(shape[0] for shape in shapes)
    buffer = (ctypes.c_float * (rows * row))()
    offset = 0
    for output, shape in zip(outputs, shapes):
        size = shape[0] * row * 4
        ctypes.memmove(ctypes.addressof(buffer) + offset, output.__array_interface__["data"][0], size)
        offset += size
    return Float32Array(ctypes.addressof(buffer), (rows, *shapes[0][1:]), owner=buffer)
