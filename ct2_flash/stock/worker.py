"""The stock engine's process: stock ``ctranslate2`` and one Whisper model, serving requests.

Started by ``client.StockEngine`` as ``python worker.py STOCK_DIR``; ``STOCK_DIR`` goes first on
``sys.path`` so that ``import ctranslate2`` finds the stock release, not the patched runtime of
the environment. It imports nothing from ct2_flash, whose import would load the patched
runtime. Requests, one JSON line each on stdin (answers on stdout, errors as {"error": ...}):

    {"op": "load", "model": DIR, "compute_type": "int8", "intra_threads": 2, "inter_threads": 1, "seed": null,
     "keep_freed_memory": true}
    {"op": "encode", "block": NAME, "shape": [batch, mels, frames]}  -> {"handle": H, "shape": [...]}
    {"op": "fetch", "handle": H, "block": NAME}                       -> {"shape": [...]}  (written there)
    {"op": "generate", "handle": H, "prompts": [...], "options": {...}} -> {"results": [...]}
    {"op": "detect_language", "handle": H}                            -> {"languages": [[[token, p], ...], ...]}
    {"op": "align", "handle": H, "start_sequence": [...], "text_tokens": [...], "num_frames": N,
     "median_filter_width": 7}                                         -> {"alignments": [...]}

The load answer says whether freed memory is kept, as asked (``keep_freed_memory``). Every answer carries
"seconds", the time the request took here. Every request may carry
"release": [H, ...], encoder outputs the client no longer holds. The
newest ``KEPT`` outputs are kept in any case; an older one asked for answers {"error":
"unknown handle"} and the client encodes again.
"""

import ctypes
import os
import sys
import time
from collections import OrderedDict

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
    page faults per window of tiny.en or base. Served from a heap that is never given back
    (nothing from new mappings; 1 GiB is "never" for the trim threshold), the same blocks are
    reused: the encoder 20-35% faster (docs/measurements.md). The price is that the worker
    keeps its peak memory. Called after loading, so that what the conversion to the compute
    type freed has gone back. Only this process, which runs nothing but the model, is changed.
    """
    return _mallopt(_M_MMAP_MAX, 0) and _mallopt(_M_TRIM_THRESHOLD, 1 << 30)


def serve(stdin, stdout) -> None:
    import ctranslate2
    import numpy as np
    import protocol  # this folder is on sys.path: the script's own

    blocks = protocol.Blocks(owner=False)
    outputs: "OrderedDict[int, object]" = OrderedDict()
    model, next_handle = None, 0
    for line in stdin:
        request = protocol.decode(line)
        for handle in request.get("release", ()):
            outputs.pop(handle, None)
        op = request["op"]
        started = time.perf_counter()
        try:
            if op == "load":
                keep = bool(request.get("keep_freed_memory")) and one_arena()
                if request.get("seed") is not None:
                    ctranslate2.set_random_seed(request["seed"])
                model = ctranslate2.models.Whisper(request["model"], device="cpu", compute_type=request["compute_type"],
                                                   intra_threads=request["intra_threads"],
                                                   inter_threads=request["inter_threads"])
                # After loading: what the conversion to the compute type freed has gone back.
                kept = keep and keep_freed_memory()
                answer = {"ready": True, "version": ctranslate2.__version__, "compute_type": model.compute_type,
                          "keep_freed_memory": kept}
            elif op == "encode":
                features = blocks.array(request["block"], request["shape"])
                output = model.encode(ctranslate2.StorageView.from_array(features))
                next_handle += 1
                outputs[next_handle] = output
                while len(outputs) > KEPT:
                    outputs.popitem(last=False)
                answer = {"handle": next_handle, "shape": list(output.shape)}
            elif request.get("handle") not in outputs:
                answer = {"error": "unknown handle"}
            elif op == "fetch":
                output = np.asarray(outputs[request["handle"]])
                blocks.array(request["block"], output.shape)[...] = output
                answer = {"shape": list(output.shape)}
            elif op == "generate":
                results = model.generate(outputs[request["handle"]], request["prompts"], **request["options"])
                answer = {"results": [{"sequences": r.sequences, "sequences_ids": r.sequences_ids, "scores": r.scores,
                                       "no_speech_prob": r.no_speech_prob} for r in results]}
            elif op == "detect_language":
                answer = {"languages": model.detect_language(outputs[request["handle"]])}
            elif op == "align":
                results = model.align(outputs[request["handle"]], request["start_sequence"], request["text_tokens"],
                                      request["num_frames"], median_filter_width=request["median_filter_width"])
                answer = {"alignments": [{"alignments": [list(pair) for pair in r.alignments],
                                          "text_token_probs": list(r.text_token_probs)} for r in results]}
            else:
                answer = {"error": f"unknown request {op!r}"}
        except Exception as error:  # the engine's errors go back to the caller, who decides
            answer = {"error": f"{type(error).__name__}: {error}"}
        answer["seconds"] = time.perf_counter() - started  # the work itself: the rest is the channel's
        stdout.write(protocol.encode(answer))
        stdout.flush()
    blocks.close()


if __name__ == "__main__":
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
