"""The loop's side of the stock engine: ``StockEngine`` starts the worker, asks it, and copes
when it cannot answer.

One worker per engine, started by ``start()`` (without waiting for it to load) or else on the
first request, holding its own copy of the model. Threads sharing the model (faster-whisper's
``num_workers``) have their requests served at once, up to ``inter_threads`` of them, each call
on ``intra_threads`` threads, as the in-process model would: each request has its id and its
own shared-memory block, and a reader thread hands each answer to the thread that asked. Every
request has a deadline; a worker that misses it, dies or answers garbage is killed and
``StockUnavailable`` raised to every thread waiting on it, so the caller can take the patched
runtime instead (the features stay on this side for that). A worker that died is started again
on the next request, up to ``MAX_RESTARTS`` times; one that cannot start is not tried again.
A process forked from one with an engine gets an engine of its own: the parent's worker, pipes
and blocks stay the parent's, and the child starts its own worker at its first request.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ct2_flash.engine import forks
from ct2_flash.stock import protocol
from ct2_flash.stock.allocator import GLIBC_DEFAULT, Allocator, chosen_allocator, tuned_allocator
from ct2_flash.stock.location import installed, stock_dir

logger = logging.getLogger("ct2_flash")

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")
MAX_RESTARTS = 3
# Seconds: loading a model (base at int8: ~1 s here), and any one request (a 30 s window's
# beam search on base takes a few seconds on 2 cores; this only catches a hung worker).
START_TIMEOUT = 120.0
REQUEST_TIMEOUT = 300.0


def worker_allocator(keep_freed_memory: bool) -> Allocator:
    """The worker's allocator: tcmalloc where installed, unless freed memory is to go back or
    ``CT2_FLASH_WORKER_ALLOCATOR=glibc``; otherwise glibc (its settings made by the worker)."""
    choice = chosen_allocator("CT2_FLASH_WORKER_ALLOCATOR")
    tuned = tuned_allocator()
    return tuned if choice == "tcmalloc" and keep_freed_memory and tuned.library else GLIBC_DEFAULT


def default_invariance_file() -> str:
    """Where workers keep, per machine, whether its CPU decodes rows the same in a batch."""
    return os.path.join(os.path.expanduser("~"), ".cache", "ct2_flash", "batch_invariance.json")


class StockUnavailable(RuntimeError):
    """The stock engine did not answer this request; the patched runtime must serve it."""


@dataclass(frozen=True)
class GenerationResult:
    """Stands in for ``ctranslate2.models.WhisperGenerationResult``."""

    sequences: List[List[str]]
    sequences_ids: List[List[int]]
    scores: List[float]
    no_speech_prob: float


@dataclass(frozen=True)
class AlignmentResult:
    """Stands in for ``ctranslate2.models.WhisperAlignmentResult``."""

    alignments: List[tuple]
    text_token_probs: List[float]


class RemoteEncoding:
    """Stands in for an encoder output ``StorageView`` that stays in the worker.

    Attributes:
        shape: [batch, frames, d_model], as the StorageView's.
        features: [batch, n_mels, frames] float32, the input, kept so that the patched runtime
            can encode it again if the worker cannot serve this encoding any more.
        copy: the encoder output as a StorageView on this side, once a call needed it there
            (``Engines.local``), else None.
    """

    def __init__(
        self, engine: "StockEngine", handle: int, generation: int, shape: Sequence[int], features: np.ndarray
    ) -> None:
        self.handle, self.generation, self.shape, self.features = handle, generation, tuple(shape), features
        self.copy = None
        # The worker may drop it once nothing here refers to it (told with the next request).
        weakref.finalize(self, engine.release, handle, generation)


class _Lease:
    """A request's shared-memory block (``_block``); replaced by a copy where the worker that
    mapped it has stopped, since its name is gone (``StockEngine._renew``)."""

    def __init__(self, block) -> None:
        self.block = block


class _Call:
    """One request sent: set ``done`` once ``answer`` came, or ``failure`` says why none will."""

    __slots__ = ("done", "answer", "failure")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.answer: Optional[dict] = None
        self.failure: Optional[str] = None


class _Channel:
    """One worker process's pipes: each request goes with an id, and a reader thread hands each
    answer to the request with its id. Once the pipe ends or carries garbage, every request
    waiting and every later one ends with the reason (``EOFError``)."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.process = process
        self._lock = threading.Lock()  # the ids, the calls waiting and writes to the pipe
        self._calls: Dict[int, _Call] = {}  # by id: sent, not answered
        self._next_id = 0
        self.closed: Optional[str] = None
        threading.Thread(target=self._read, name=f"ct2-flash stock worker {process.pid}", daemon=True).start()

    def send(self, request: dict) -> _Call:
        """Write ``request`` (its id added); what ``wait`` takes. ``TypeError``/``ValueError``
        for what JSON cannot carry (nothing sent), ``OSError``/``EOFError`` for a dead pipe."""
        with self._lock:
            if self.closed is not None:
                raise EOFError(self.closed)
            message = protocol.encode({**request, "id": self._next_id + 1})
            self._next_id += 1
            call = self._calls[self._next_id] = _Call()
            try:
                self.process.stdin.write(message)
                self.process.stdin.flush()
            except OSError:
                del self._calls[self._next_id]
                raise
        return call

    @staticmethod
    def wait(call: _Call, timeout: float) -> dict:
        """The answer to a sent request; ``TimeoutError`` past ``timeout`` s, ``EOFError`` if none will come."""
        if not call.done.wait(timeout):
            raise TimeoutError(f"no answer within {timeout:.0f} s")
        if call.failure is not None:
            raise EOFError(call.failure)
        return call.answer

    def _read(self) -> None:
        stream = self.process.stdout
        try:
            for line in stream:
                answer = protocol.decode(line)
                with self._lock:
                    call = self._calls.pop(answer.get("id"), None)
                if call is None:
                    raise ValueError(f"an answer to no request: {line[:80]!r}")
                call.answer = answer
                call.done.set()
            try:
                code = self.process.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                code = None
            reason = f"the worker exited (code {code})"
        except (OSError, ValueError, AttributeError) as error:  # not JSON, JSON but no object, a closed pipe
            reason = f"{type(error).__name__}: {error}"
        with self._lock:
            self.closed = reason
            calls, self._calls = list(self._calls.values()), {}
        for call in calls:
            call.failure = reason
            call.done.set()
        try:
            stream.close()
        except OSError:
            pass


class StockEngine:
    """A Whisper model on stock ``ctranslate2`` in a worker process.

    Args:
        model_path: the CTranslate2 model directory.
        compute_type: as resolved by the patched runtime's model (e.g. ``int8_float32``).
        intra_threads, inter_threads: the worker model's threads: ``inter_threads`` requests
            run at once, each on ``intra_threads`` threads.
        seed: seeds the worker's sampling (``ctranslate2.set_random_seed``), or None.
        directory: where stock ``ctranslate2`` is installed (default ``location.stock_dir()``).
        keep_freed_memory: have the worker's C library keep what the engine frees, for its
            next call (``worker.keep_freed_memory``: a faster encoder, the worker's peak memory
            kept); default on, off with ``CT2_FLASH_WORKER_KEEPS_MEMORY=0``.
        allocator: the allocator the worker runs under (``allocator.py``); default tcmalloc
            preloaded where its library is installed and freed memory is kept (the decode's
            many small allocations are cheaper there than in glibc), else glibc with the
            settings above; ``CT2_FLASH_WORKER_ALLOCATOR=glibc`` keeps glibc.
        max_batch_rows: the most rows one ``generate()`` call decodes: concurrent requests
            that can share a call run as one (``batching.py``); 1 runs each alone.
        batch_wait: seconds a request may wait for partners while others are served (0: it
            takes only those already waiting).
        invariance_file: where the worker keeps its verdict on this CPU's batch invariance
            (``invariance.py``; default ``default_invariance_file()``; "" keeps none).

    Attributes:
        allocator: what the worker runs, from its load answer ("tcmalloc", "glibc"), None before.
    """

    def __init__(
        self,
        model_path: str,
        compute_type: str,
        intra_threads: int,
        inter_threads: int = 1,
        seed: Optional[int] = None,
        directory: str = "",
        keep_freed_memory: Optional[bool] = None,
        allocator: Optional[Allocator] = None,
        max_batch_rows: int = 1,
        batch_wait: float = 0.0,
        invariance_file: Optional[str] = None,
    ) -> None:
        if int(max_batch_rows) < 1:
            raise ValueError(f"max_batch_rows must be >= 1, got {max_batch_rows!r}")
        if not batch_wait >= 0:
            raise ValueError(f"batch_wait must be a number of seconds >= 0, got {batch_wait!r}")
        if keep_freed_memory is None:
            keep_freed_memory = os.environ.get("CT2_FLASH_WORKER_KEEPS_MEMORY", "1") != "0"
        if allocator is None:
            allocator = worker_allocator(bool(keep_freed_memory))
        self._allocator = allocator
        self._load = {
            "op": "load",
            "model": os.path.abspath(model_path),
            "compute_type": compute_type,
            "intra_threads": intra_threads,
            "inter_threads": inter_threads,
            "seed": seed,
            "keep_freed_memory": bool(keep_freed_memory),
            "max_batch_rows": int(max_batch_rows),
            "batch_wait": float(batch_wait),
            "invariance_file": invariance_file if invariance_file is not None else default_invariance_file(),
        }
        self.max_batch_rows = int(max_batch_rows)
        self.directory = directory or stock_dir()
        self.disabled: Optional[str] = None  # why the engine is not used any more
        self.restarts = 0
        self.generation = 0  # counts workers started: handles of an earlier one are void
        self.version: Optional[str] = None
        # Whether the worker's C library keeps freed memory for reuse (worker.keep_freed_memory).
        self.keeps_freed_memory: Optional[bool] = None
        self.allocator: Optional[str] = None
        self._process: Optional[subprocess.Popen] = None
        self._channel: Optional[_Channel] = None
        self._loading: Optional[_Call] = None  # the load request, until its answer is read
        # The worker's state (start, stop, restarts), the free blocks and the counters below.
        # Held while sending, never while waiting for an answer, except the load's.
        self._lock = threading.Lock()
        self._blocks = protocol.Blocks(owner=True)
        self._free: List = []  # shared-memory blocks no request holds
        self._released: List[int] = []  # encoder outputs this side dropped: the worker may too
        self._unmapped: List[str] = []  # blocks this side dropped: the worker unmaps them too
        # Blocks of requests interrupted while the worker ran them -> those requests and the
        # generation of the worker asked: the worker unmaps such a block once it has answered (it
        # may read or write it until then), and drops the output an interrupted encode made.
        self._orphaned: Dict[str, Tuple[_Call, int]] = {}
        self._mapped_by: Dict[str, int] = {}  # block -> generation of the worker that mapped it (then unlinked)
        self._died = False
        forks.forget_parent_in_children(self)
        # What the channel costs: per request kind, [requests, round-trip seconds, seconds the
        # worker spent on them]; the difference is pipes, shared memory and JSON.
        self.timings: dict = {}
        # generate() requests answered, by the rows of the call that decoded them (1: alone).
        self.rows_in_calls: Dict[int, int] = {}

    # -- requests -----------------------------------------------------------------------------

    def encode(self, features: np.ndarray) -> RemoteEncoding:
        """Encode [batch, n_mels, frames] float32 features; the output stays in the worker."""
        features = np.ascontiguousarray(features, dtype=np.float32)
        with self._block(features.nbytes) as lease:
            self._array(lease.block.name, features.shape)[...] = features
            answer, generation = self._ask({"op": "encode", "shape": list(features.shape)}, lease=lease)
        return RemoteEncoding(self, answer["handle"], generation, answer["shape"], features)

    def fetch(self, encoding: RemoteEncoding) -> np.ndarray:
        """[batch, frames, d_model] float32: a copy of the encoder output, for the loop."""
        with self._block(int(np.prod(encoding.shape)) * 4) as lease:
            answer, _ = self._ask({"op": "fetch"}, encoding, lease)
            return np.array(self._array(lease.block.name, answer["shape"]))

    def generate(self, encoding: RemoteEncoding, prompts, options: dict) -> List[GenerationResult]:
        """``Whisper.generate`` there, one result per row."""
        prompts = [[t if isinstance(t, str) else int(t) for t in prompt] for prompt in prompts]
        answer, _ = self._ask({"op": "generate", "prompts": prompts, "options": options}, encoding)
        rows = int(answer.get("rows_in_call", len(prompts)))
        with self._lock:
            self.rows_in_calls[rows] = self.rows_in_calls.get(rows, 0) + 1
        return [GenerationResult(**result) for result in answer["results"]]

    def detect_language(self, encoding: RemoteEncoding) -> list:
        """``Whisper.detect_language`` there: per row, (token, probability) pairs, best first."""
        languages = self._ask({"op": "detect_language"}, encoding)[0]["languages"]
        return [[(token, probability) for token, probability in row] for row in languages]

    def align(
        self, encoding: RemoteEncoding, start_sequence, text_tokens, num_frames, median_filter_width: int = 7
    ) -> List[AlignmentResult]:
        """``Whisper.align`` there."""
        frames = [int(n) for n in num_frames] if isinstance(num_frames, (list, tuple)) else int(num_frames)
        answer, _ = self._ask(
            {
                "op": "align",
                "start_sequence": [int(t) for t in start_sequence],
                "text_tokens": [[int(t) for t in row] for row in text_tokens],
                "num_frames": frames,
                "median_filter_width": int(median_filter_width),
            },
            encoding,
        )
        return [
            AlignmentResult([tuple(pair) for pair in r["alignments"]], r["text_token_probs"])
            for r in answer["alignments"]
        ]

    def release(self, handle: int, generation: int) -> None:
        """An encoding is gone on this side: the worker may drop it (told with the next request)."""
        if generation == self.generation:
            self._released.append(handle)  # list.append is atomic: no lock (finalizers run anywhere)

    def close(self) -> None:
        """Stop the worker (it exits when its stdin closes, once it has answered what it was
        asked) and free the shared memory: the free blocks now, a block that a request still
        holds when that request ends (unmapped under it, its copy would read freed pages)."""
        with self._lock:
            self._stop(kill=False)
            for block in self._free:
                self._drop(block.name)
            self._free = []

    def forget_parent(self) -> None:
        """This process is a fork's child: what the engine holds is its parent's. Used here, the
        parent's worker would get this process's requests under the parent's ids (the reader
        thread that would hand over the answers did not come along), the parent's free blocks
        would be written by both, and this process's exit would unlink them. So the engine
        forgets them, closing nothing (a buffered pipe's lock may be held by a thread that did
        not come along, and closing it would hang: the parent's worker is told to exit by a
        message, not only by the end of its stdin, which a child's copy keeps open), and starts
        a worker of its own at its first request, as the first one."""
        self._lock = threading.Lock()  # another thread of the parent may have held it
        self._process, self._channel, self._loading = None, None, None
        self._blocks = protocol.Blocks(owner=True)
        self._free, self._released, self._unmapped, self._orphaned, self._mapped_by = [], [], [], {}, {}
        self.generation += 1  # the parent's encodings are not this worker's
        self.version, self._died = None, False

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def holds(self, encoding: RemoteEncoding) -> bool:
        """Whether the running worker made ``encoding`` (one started since cannot serve it)."""
        return encoding.generation == self.generation and self.running

    # -- the worker ---------------------------------------------------------------------------

    @contextmanager
    def _block(self, size: int) -> Iterator[_Lease]:
        """A shared-memory block of at least ``size`` bytes, this request's alone while it runs.
        Blocks are reused: there are as many as requests ever ran at once (a free one too small
        is replaced). A block keeps its name in /dev/shm only until a worker has mapped it (it
        answered a request naming it): from then on nothing of it is left there, however the
        processes end."""
        with self._lock:
            block = next((b for b in self._free if b.size >= size), None)
            if block is not None:
                self._free.remove(block)
            else:
                if self._free:
                    name = self._free.pop().name
                    self._drop(name)
                    # Its pages stay while the worker maps it: told with the next request.
                    self._unmapped.append(name)
                block = self._create(size)
        lease = _Lease(block)
        try:
            yield lease
        finally:
            with self._lock:
                name = lease.block.name
                # Interrupted (the worker may still use it: told to unmap it once it has answered,
                # by ``_ask``), or the engine closed or its worker died meanwhile: given back
                # now, never reused.
                if name in self._orphaned or self._process is None:
                    self._drop(name)
                else:
                    self._free.append(lease.block)

    def _array(self, name: str, shape: Sequence[int]) -> np.ndarray:
        """The float32 array of ``shape`` at the start of block ``name`` (a view, no copy)."""
        return np.ndarray(tuple(shape), dtype=np.float32, buffer=self._blocks.map(name).buf)

    def _create(self, size: int):
        """A new block (the lock is held)."""
        try:
            return self._blocks.create(size)
        except OSError as error:  # /dev/shm full or missing: this call stays here, the worker is fine
            raise StockUnavailable(f"shared memory of {size} bytes could not be allocated ({error})") from None

    def _drop(self, name: str) -> None:
        self._blocks.drop(name)
        self._mapped_by.pop(name, None)

    def _renew(self, lease: _Lease) -> None:
        """A copy of the lease's block under a new name, where the worker that mapped the block
        (and so took its name away) is not the one running now (the lock is held)."""
        name = lease.block.name
        if self._mapped_by.get(name, self.generation) == self.generation:
            return
        block = self._create(lease.block.size)
        block.buf[:] = lease.block.buf[: block.size]
        self._drop(name)
        lease.block = block

    def _ask(
        self, request: dict, encoding: Optional[RemoteEncoding] = None, lease: Optional[_Lease] = None
    ) -> Tuple[dict, int]:
        """Send one request (about ``encoding``, if given; with the block ``lease`` holds, if
        given) and wait for its answer; with it, the generation of the worker that answered."""
        with self._lock:
            if encoding is not None:
                # Checked before asking: asking would start a new worker that cannot hold it.
                if not self.holds(encoding):
                    raise StockUnavailable("the worker that held this encoding has stopped")
                request = {**request, "handle": encoding.handle}
            self._ensure_started()
            if lease is not None:
                self._renew(lease)
                request = {**request, "block": lease.block.name}
            channel, generation = self._channel, self.generation
            for name, (call, asked) in list(self._orphaned.items()):
                if call.done.is_set():  # answered: the worker is done with the block
                    del self._orphaned[name]
                    self._unmapped.append(name)
                    handle = (call.answer or {}).get("handle")
                    if handle is not None and asked == self.generation:  # an encode nobody here holds
                        self._released.append(handle)
            released, self._released = self._released, []
            unmapped, self._unmapped = self._unmapped, []
            started = time.perf_counter()
            try:
                call = channel.send({**request, "release": released, "unmap": unmapped})
            except (TypeError, ValueError) as error:  # an option JSON cannot carry: this call stays here
                self._released.extend(released)
                self._unmapped.extend(unmapped)
                raise StockUnavailable(f"the request cannot be sent to the stock engine ({error})") from None
            except (OSError, EOFError) as error:
                self._failed(channel, error)
        try:
            answer = channel.wait(call, REQUEST_TIMEOUT)
        except (EOFError, TimeoutError) as error:
            with self._lock:
                self._failed(channel, error)
        except BaseException:  # KeyboardInterrupt: the worker goes on with the request
            if "block" in request:  # and may still read or write its block: not for another request
                with self._lock:
                    self._orphaned[request["block"]] = (call, generation)
            raise
        with self._lock:
            timing = self.timings.setdefault(request["op"], [0, 0.0, 0.0])
            timing[0] += 1
            timing[1] += time.perf_counter() - started
            timing[2] += answer.get("seconds", 0.0)
            name = request.get("block")
            gone = answer.get("error", "").startswith("unknown block")  # the worker could not map it
            if name is not None and self._blocks.linked(name) and not gone:
                self._blocks.unlink(name)  # the worker has mapped it (before anything else it did)
                self._mapped_by[name] = generation
        if "error" in answer:
            if answer["error"] == "unknown handle":
                raise StockUnavailable("the worker no longer holds this encoding")
            if gone:
                raise StockUnavailable(f"the worker could not map this request's shared memory ({answer['error']})")
            raise RuntimeError(f"stock ctranslate2: {answer['error']}")  # the engine's own error, as in-process
        return answer, generation

    def start(self) -> None:
        """Start the worker loading its model now, without waiting for it: it loads while the
        caller does other work, and the first request waits only for what is left. A worker
        that cannot start is reported by that request, as from a lazy start."""
        with self._lock:
            if self.disabled is None and self._process is None and not self._died and installed(self.directory):
                try:
                    self._spawn()
                except OSError:
                    self._stop(kill=True)  # the first request tries again and reports it

    def _ensure_started(self) -> None:
        """A worker that has loaded its model (the lock is held)."""
        if self.disabled is not None:
            raise StockUnavailable(self.disabled)
        if self.running and self.version is not None:
            return
        loading = self._loading is not None and not self._died  # started, not heard from
        if not loading:
            if self._process is not None or self._died:  # it died since it last answered
                self._stop(kill=True)
                if self.restarts >= MAX_RESTARTS:
                    self._disable(f"the stock engine's worker died {MAX_RESTARTS + 1} times")
                self.restarts += 1
                self._died = False
            if not installed(self.directory):
                self._disable(
                    f"stock ctranslate2 is not installed in {self.directory} (bash scripts/install.sh, or "
                    "python -m ct2_flash.stock)"
                )
        try:
            if not loading:
                self._spawn()
            answer = self._channel.wait(self._loading, START_TIMEOUT)
        except (OSError, EOFError, TimeoutError) as error:
            self._stop(kill=True)
            self._disable(f"the stock engine's worker did not start ({type(error).__name__}: {error})")
        self._loading = None
        if not answer.get("ready"):
            self._stop(kill=True)
            self._disable(f"the stock engine could not load {self._load['model']}: {answer.get('error')}")
        self.version = answer["version"]
        self.keeps_freed_memory = bool(answer.get("keep_freed_memory"))
        self.allocator = answer.get("allocator", "glibc")
        if self._allocator.library and self.allocator != "tcmalloc":
            logger.info(
                "ct2-flash: the stock engine's worker runs glibc's allocator: the loader refused %s",
                self._allocator.library,
            )

    def _spawn(self) -> None:
        """A new worker process, asked to load the model (its answer is read by ``_ensure_started``)."""
        self.generation += 1
        self.version = None
        self._process = subprocess.Popen(
            [sys.executable, WORKER, self.directory],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None,
            env=self._allocator.environment(os.environ),
        )
        self._channel = _Channel(self._process)
        self._loading = self._channel.send(self._load)

    def _failed(self, channel: _Channel, error: Exception) -> None:
        """The worker behind ``channel`` did not answer: killed, unless another request has seen
        to it already (the lock is held)."""
        if channel is self._channel:
            self._stop(kill=True)
            self._died = True
        raise StockUnavailable(f"the stock engine's worker stopped answering ({type(error).__name__}: {error})")

    def _disable(self, reason: str) -> None:
        self.disabled = reason
        raise StockUnavailable(reason)

    def _stop(self, kill: bool) -> None:
        """Stop the worker (the lock is held); its reader thread closes its output at the end."""
        process, self._process, self._channel, self._loading = self._process, None, None, None
        if process is None:
            return
        try:
            if kill:
                process.kill()
            else:
                # Told, not only by its stdin's end: a forked child's copy of the pipe keeps it open.
                process.stdin.write(protocol.encode({"op": "exit"}))
                process.stdin.close()
            process.wait(timeout=10)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            process.kill()
            process.wait()
        try:
            process.stdin.close()
        except OSError:
            pass
