"""The stock engine's process: stock ``ctranslate2`` and one Whisper model, serving requests.

Started by ``client.StockEngine`` as ``python worker.py STOCK_DIR``; ``STOCK_DIR`` goes first on
``sys.path`` so that ``import ctranslate2`` finds the stock release, not the patched runtime of
the environment. It imports nothing from ct2_flash, whose import would load the patched
runtime, nor numpy: its start is on the path of a process's first call, and arrays reach the
engine through their address and shape (``batching.Float32Array``, ``ctypes.memmove``). Requests, one
JSON line each on stdin, each with an "id" that its answer on stdout repeats (errors as
{"error": ...}):

    {"op": "load", "model": DIR, "compute_type": "int8", "intra_threads": 2, "inter_threads": 1, "seed": null,
     "keep_freed_memory": true, "max_batch_rows": 16, "batch_wait": 0.0, "invariance_file": PATH}
    {"op": "encode", "block": NAME, "shape": [batch, mels, frames]}  -> {"handle": H, "shape": [...]}
    {"op": "fetch", "handle": H, "block": NAME}                       -> {"shape": [...]}  (written there)
    {"op": "generate", "handle": H, "prompts": [...], "options": {...}} -> {"results": [...], "rows_in_call": N}
    {"op": "detect_language", "handle": H}                            -> {"languages": [[[token, p], ...], ...]}
    {"op": "align", "handle": H, "start_sequence": [...], "text_tokens": [...], "num_frames": N,
     "median_filter_width": 7}                                         -> {"alignments": [...]}
    {"op": "exit"}   (no answer: as the end of stdin, every request before it answered first)

The load answer says whether freed memory is kept, as asked (``keep_freed_memory``), and which
allocator this process runs ("tcmalloc" where the client preloaded it, else "glibc"). After it,
up to ``inter_threads`` requests run at once, one per replica of the model, as threads sharing
the model in-process would (faster-whisper's ``num_workers``); answers come as they finish, so
in another order than asked. ``generate()`` requests that can share a call run as one, up to
``max_batch_rows`` rows (``batching.py``: the scheduler; ``invariance.py``: the check of this
CPU before the first batch); "rows_in_call" says how many rows the call decoded. Every answer
carries "seconds", the time the request took here (of a call it shared, its share by rows).
A request's "block" is mapped before anything else is done with it (an error answer included),
so that the client can take the block's name out of /dev/shm once the answer comes; a block
whose name is gone by then is answered {"error": "unknown block ..."}. Every request may carry
"release": [H, ...], encoder outputs the client no longer holds, and "unmap": [NAME, ...],
blocks it has dropped (their pages stay until every process unmaps them; a block is dropped
only once every request naming it is answered). The newest ``KEPT`` outputs are kept in any
case; an older one asked for answers {"error": "unknown handle"} and the client encodes again.
"""

import ctypes
import json
import math
import os
import signal
import sys
import threading
import time
from collections import OrderedDict
from typing import Optional

import batching  # this folder is first on sys.path (below): the script's own

KEPT = 32
# glibc's mallopt parameters.
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8


def _mallopt(parameter: int, value: int) -> bool:
    try:
        return bool(ctypes.CDLL(None).mallopt(parameter, value))
    except (OSError, AttributeError):  # not glibc
        return False


def one_arena() -> bool:
    """Before the model starts its threads: every thread allocates from glibc's main heap.

    A thread's own arena grows in heaps of at most 64 MB, so a larger block (an encoder
    layer's attention scores for base: 72 MB) is mapped afresh every time whatever
    ``keep_freed_memory`` says; the main heap has no such limit.
    """
    return _mallopt(_M_ARENA_MAX, 1)


def keep_freed_memory() -> bool:
    """After loading the model: glibc keeps the memory CTranslate2 frees, for its next call.

    CTranslate2 allocates every operation's output on the CPU afresh and frees it after. glibc
    serves a large block (an encoder layer's attention scores: 54 MB for a 30 s window of
    tiny.en) with a new mapping and unmaps it when freed, and gives the top of the heap back
    past a threshold, so each window faults in and zero-fills its buffers again: 50,000-110,000
    page faults per window. Served from a heap that is never given back (nothing from new
    mappings; 1 GiB is "never" for the trim threshold), the same blocks are reused and the
    encoder runs faster (docs/measurements.md, "The worker keeps freed memory"). The price is that the worker
    keeps its peak memory. Called after loading, so that what the conversion to the compute
    type freed has gone back. Only this process, which runs nothing but the model, is changed.
    """
    return _mallopt(_M_MMAP_MAX, 0) and _mallopt(_M_TRIM_THRESHOLD, 1 << 30)


def allocator() -> str:
    """ "tcmalloc" if the client's preload took (the library is mapped here), else "glibc": the
    check of ``allocator.loaded_allocator``, here because this process imports nothing from ct2_flash."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as stream:
            return "tcmalloc" if "libtcmalloc" in stream.read() else "glibc"
    except OSError:
        return "glibc"


def serve(stdin, stdout) -> None:
    import ctranslate2
    import protocol  # this folder is on sys.path: the script's own

    state = _State(protocol, ctranslate2, stdout)
    waiting = None  # the queue (batching.Batches), once the model is loaded
    threads: list = []
    for line in stdin:
        request = protocol.decode(line)
        if request["op"] == "exit":  # as at stdin's end (a forked child of the client may hold it open)
            break
        # Resolved here, in the order asked: a later request's eviction cannot void an earlier one's handle.
        try:
            encoding = state.take(request)
        except OSError as error:  # its block is gone: the client unlinked it before this worker mapped it
            state.answer(request, {"error": f"unknown block ({error})", "seconds": 0.0})
            continue
        if request["op"] == "load" or waiting is None:  # before the model: answered at once (with its error)
            state.run(request, encoding)
            if state.model is not None and waiting is None:
                waiting = state.queue(request)
                threads = [
                    threading.Thread(target=_serve_requests, args=(state, waiting), daemon=True)
                    for _ in range(max(1, int(request["inter_threads"])))
                ]
                for thread in threads:
                    thread.start()
        else:
            waiting.put((request, encoding))
    if waiting is not None:  # every request asked is answered before the exit
        waiting.stop()
    for thread in threads:
        thread.join()
    state.blocks.close()


def _serve_requests(state: "_State", waiting) -> None:
    """One of ``inter_threads`` threads: serves requests in the order asked, ``generate()``
    requests that can share a call together (``batching.Batches``), until told to stop."""
    for items in iter(waiting.take, None):
        try:
            state.run_together(items)
        finally:
            waiting.done()


class _State:
    """The model, the encoder outputs it keeps and the shared-memory blocks it has mapped, for
    requests that run on several threads at once (``lock`` guards all but the model's calls)."""

    def __init__(self, protocol, ctranslate2, stdout) -> None:
        self.protocol, self.ctranslate2, self.stdout = protocol, ctranslate2, stdout
        self.blocks = protocol.Blocks(owner=False)
        self.outputs: "OrderedDict[int, object]" = OrderedDict()
        self.model, self.next_handle = None, 0
        self.lock = threading.Lock()
        # Batching (``queue``): the ids the batch key needs, whether sampling is seeded, and
        # whether this CPU decodes a row the same in a batch (None: not checked yet).
        self.sot: Optional[int] = None
        self.prev: Optional[int] = None
        self.seeded = False
        self.invariant: Optional[bool] = None
        self.invariance_file: Optional[str] = None
        self.threads = 0
        self._checking = threading.Lock()

    def queue(self, load: dict) -> batching.Batches:
        """The queue the serving threads take requests from, batching as the load request
        asked (``max_batch_rows``, ``batch_wait``)."""
        self.sot, self.prev = _special_ids(load["model"])
        self.seeded = load.get("seed") is not None
        self.threads = int(load.get("intra_threads") or 0)
        self.invariance_file = load.get("invariance_file")

        def key(item):
            request, encoding = item
            rows = encoding.shape[0] if encoding is not None else 0
            return batching.batch_key(request, rows, self.sot, self.seeded)

        return batching.Batches(
            key,
            lambda item: len(item[0].get("prompts") or ()) or 1,
            max_rows=max(1, int(load.get("max_batch_rows") or 1)),
            wait_seconds=float(load.get("batch_wait") or 0.0),
            threads=max(1, int(load["inter_threads"])),
        )

    def run_together(self, items: list) -> None:
        """Serve ``items`` (requests with their encodings): one alone as ``run`` does, several
        ``generate()`` requests of one batch key as one call over their stacked encoder outputs,
        each answered with its own rows. Where this CPU is not batch-invariant, or the batched
        call raises, each is served alone: its own results, or its own error."""
        if len(items) == 1 or not self.batch_invariant():
            for item in items:
                self.run(*item)
            return
        started = time.perf_counter()
        requests = [request for request, _ in items]
        rows = [len(request["prompts"]) for request in requests]
        try:
            together = batching.stacked([encoding for _, encoding in items])
            results = self.model.generate(
                self.ctranslate2.StorageView.from_array(together),
                [prompt for request in requests for prompt in request["prompts"]],
                **requests[0]["options"],
            )
        except Exception:
            for item in items:
                self.run(*item)
            return
        seconds = time.perf_counter() - started
        for request, part, count in zip(requests, batching.split(results, rows), rows):
            # Its share of the call's time, by rows: the requests' seconds add up to the call's.
            self.answer(
                request, {**_generated(part), "seconds": seconds * count / sum(rows), "rows_in_call": sum(rows)}
            )

    def batch_invariant(self) -> bool:
        """Whether this CPU decodes a row the same inside a batch as alone
        (``invariance.batch_invariant``): checked once, before the first batch, and kept per
        machine in ``invariance_file``."""
        with self._checking:
            if self.invariant is None:
                import invariance  # this folder is on sys.path: the script's own

                ctranslate2 = self.ctranslate2
                key = invariance.machine_key(ctranslate2.__version__, self.model.compute_type, self.threads)
                verdict = invariance.remembered(self.invariance_file, key)
                if verdict is None:
                    try:
                        verdict = invariance.batch_invariant(
                            self.model,
                            ctranslate2.StorageView,
                            batching.Float32Array,
                            batching.stacked,
                            self.sot,
                            self.prev,
                        )
                    except Exception as error:  # a check that cannot run proves nothing: no batching
                        sys.stderr.write(f"ct2-flash worker: the batch check failed ({error}): not batching\n")
                        self.invariant = False
                        return False  # not kept: checked again by the next worker
                    invariance.remember(self.invariance_file, key, verdict)
                self.invariant = verdict
                if not verdict:
                    sys.stderr.write("ct2-flash worker: this CPU decodes rows differently in a batch: not batching\n")
            return self.invariant

    def take(self, request: dict):
        """Drop what ``request`` releases and unmaps, and map its block (the client unlinks a
        block's name once a worker has answered a request naming it); the encoder output it
        names, or None. ``OSError`` for a block that is gone."""
        with self.lock:
            for handle in request.get("release", ()):
                self.outputs.pop(handle, None)
            for name in request.get("unmap", ()):
                self.blocks.drop(name)
            if "block" in request:
                self.blocks.map(request["block"])
            return self.outputs.get(request.get("handle"))

    def address(self, name: str, shape) -> int:
        """Where block ``name`` holds a float32 array of ``shape``."""
        with self.lock:  # mapped by ``take`` already: a lookup
            return self.blocks.address(name, 4 * math.prod(shape))

    def run(self, request: dict, encoding) -> None:
        """Serve one request and write its answer."""
        op = request["op"]
        started = time.perf_counter()
        try:
            if op == "load":
                answer = self._load(request)
            elif op == "encode":
                # No view of a block outlives the call that uses it (none is alive when the answer
                # goes): the client may drop the block then, and its address read after the
                # unmap would crash this process.
                output = self.model.encode(
                    self.ctranslate2.StorageView.from_array(
                        batching.Float32Array(self.address(request["block"], request["shape"]), request["shape"])
                    )
                )
                with self.lock:
                    self.next_handle += 1
                    self.outputs[self.next_handle] = output
                    while len(self.outputs) > KEPT:
                        self.outputs.popitem(last=False)
                    answer = {"handle": self.next_handle, "shape": list(output.shape)}
            elif encoding is None:
                answer = {"error": "unknown handle"}
            elif op == "fetch":
                source = encoding.__array_interface__
                if source["typestr"] != batching.FLOAT32:
                    raise TypeError(f"the encoder output is {source['typestr']}, not float32")
                ctypes.memmove(
                    self.address(request["block"], source["shape"]), source["data"][0], 4 * math.prod(source["shape"])
                )
                answer = {"shape": list(source["shape"])}
            elif op == "generate":
                answer = _generated(self.model.generate(encoding, request["prompts"], **request["options"]))
                answer["rows_in_call"] = len(request["prompts"])
            elif op == "detect_language":
                answer = {"languages": self.model.detect_language(encoding)}
            elif op == "align":
                results = self.model.align(
                    encoding,
                    request["start_sequence"],
                    request["text_tokens"],
                    request["num_frames"],
                    median_filter_width=request["median_filter_width"],
                )
                answer = {
                    "alignments": [
                        {
                            "alignments": [list(pair) for pair in r.alignments],
                            "text_token_probs": list(r.text_token_probs),
                        }
                        for r in results
                    ]
                }
            else:
                answer = {"error": f"unknown request {op!r}"}
        except Exception as error:  # the engine's errors go back to the caller, who decides
            answer = {"error": f"{type(error).__name__}: {error}"}
        answer["seconds"] = time.perf_counter() - started  # the work itself: the rest is the channel's
        self.answer(request, answer)

    def answer(self, request: dict, answer: dict) -> None:
        message = self.protocol.encode({**answer, "id": request.get("id")})
        with self.lock:  # one answer, one whole line
            self.stdout.write(message)
            self.stdout.flush()

    def _load(self, request: dict) -> dict:
        ctranslate2 = self.ctranslate2
        keep = bool(request.get("keep_freed_memory")) and one_arena()
        if request.get("seed") is not None:
            ctranslate2.set_random_seed(request["seed"])
        self.model = ctranslate2.models.Whisper(
            request["model"],
            device="cpu",
            compute_type=request["compute_type"],
            intra_threads=request["intra_threads"],
            inter_threads=request["inter_threads"],
        )
        # After loading: what the conversion to the compute type freed has gone back.
        kept = keep and keep_freed_memory()
        return {
            "ready": True,
            "version": ctranslate2.__version__,
            "compute_type": self.model.compute_type,
            "keep_freed_memory": kept,
            "allocator": allocator(),
        }


def _generated(results) -> dict:
    """A ``generate()`` answer's body: its rows' results."""
    return {
        "results": [
            {
                "sequences": r.sequences,
                "sequences_ids": r.sequences_ids,
                "scores": r.scores,
                "no_speech_prob": r.no_speech_prob,
            }
            for r in results
        ]
    }


def _special_ids(model_dir: str) -> tuple:
    """(``<|startoftranscript|>``, ``<|startofprev|>``) ids in the model's vocabulary file
    (``vocabulary.json`` or ``vocabulary.txt``), None for one not found: the batch key's
    prompt layout needs the first; without it nothing is batched."""
    tokens: list = []
    try:
        if os.path.isfile(os.path.join(model_dir, "vocabulary.json")):
            with open(os.path.join(model_dir, "vocabulary.json"), encoding="utf-8") as stream:
                tokens = json.load(stream)
        else:
            with open(os.path.join(model_dir, "vocabulary.txt"), encoding="utf-8") as stream:
                tokens = stream.read().split("\n")
    except (OSError, ValueError):
        return None, None
    ids = {token: index for index, token in enumerate(tokens) if isinstance(token, str) and token.startswith("<|start")}
    return ids.get("<|startoftranscript|>"), ids.get("<|startofprev|>")


if __name__ == "__main__":
    # The client decides when this process ends (an "exit", the end of stdin, a kill): a Ctrl-C
    # at the terminal, sent to the whole process group, interrupts the caller's wait only.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.path.insert(0, sys.argv[1])  # stock ctranslate2 before the environment's patched one
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    # Answers go to a copy of stdout; anything else the engine prints lands on stderr.
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    serve(sys.stdin.buffer, answers)
    # The client waits for this exit (at its own exit too): nothing is left to flush or give back
    # that the kernel does not reclaim, so skip the interpreter's teardown of the engine and model.
    sys.stderr.flush()
    os._exit(0)
