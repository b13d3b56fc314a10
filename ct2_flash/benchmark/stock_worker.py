"""Runs faster-whisper on stock ctranslate2, as users install it today: in a stock environment,
or in ct2-flash's own with the stock engine's directory first on ``PYTHONPATH``.

Not imported by ct2_flash, and imports nothing from it (that would load the patched runtime,
or, in a stock environment, is not there). It reads JSON requests from stdin, one per line, and answers
each with one JSON line on stdout:

    {"model": DIR, "compute_type": "int8", "threads": 2}          -> {"ready": true, "ctranslate2": "4.8.5"}
    {"audio": "clip.npy", "options": {"beam_size": 1}, "seed": 0}  -> {"whole": s, "encode": s, "decode": s,
                                                                       "tokens": [[...]], "text": "...",
                                                                       "words": [[start, end, word], ...]}

A request with ``"batched": true`` runs faster-whisper's ``BatchedInferencePipeline`` around the
same model (``options`` carry its ``batch_size``). The load request may carry ``"num_workers"``
(faster-whisper's, default 1); then

    {"audios": ["a.npy", ...], "workers": 2, "options": {...}}     -> {"seconds": s, "tokens": [[[...]], ...]}

has that many threads share the model, the files split among them in turns, and answers the
wall time until the last is transcribed and each file's segment tokens.

Timing is ``ct2_flash/benchmark/measure.py`` itself, loaded by file path so both environments measure
the same way.
"""

import importlib.util
import json
import os
import sys


def shared(model, clips: list, workers: int, options: dict) -> tuple:
    """``workers`` threads sharing ``model`` transcribe ``clips`` (split in turns): (wall seconds,
    per clip in order its segments' tokens). Also how ``bench/thread_throughput.py`` runs the
    in-process systems, so both sides are timed and compared alike."""
    import threading
    import time

    tokens: list = [None] * len(clips)
    errors = []

    def work(indices):
        try:
            for index in indices:
                tokens[index] = [list(segment.tokens) for segment in model.transcribe(clips[index], **options)[0]]
        except Exception as error:  # noqa: BLE001 - raised after the join
            errors.append(error)

    threads = [threading.Thread(target=work, args=(range(first, len(clips), workers),)) for first in range(workers)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    if errors:
        raise errors[0]
    return seconds, tokens


def main() -> None:
    import ctranslate2
    import numpy as np
    from faster_whisper import BatchedInferencePipeline, WhisperModel

    spec = importlib.util.spec_from_file_location("measure", os.path.join(os.path.dirname(__file__), "measure.py"))
    measure_module = importlib.util.module_from_spec(spec)
    sys.modules["measure"] = measure_module  # dataclasses look their module up there
    spec.loader.exec_module(measure_module)
    model = pipeline = None
    for line in sys.stdin:
        request = json.loads(line)
        if "model" in request:
            model = WhisperModel(
                request["model"],
                compute_type=request["compute_type"],
                cpu_threads=request["threads"],
                num_workers=request.get("num_workers", 1),
            )
            pipeline = BatchedInferencePipeline(model)
            answer = {"ready": True, "ctranslate2": ctranslate2.__version__}
        elif "audios" in request:
            seconds, tokens = shared(
                model, [np.load(path) for path in request["audios"]], request["workers"], request["options"]
            )
            answer = {"seconds": seconds, "tokens": tokens}
        else:
            ctranslate2.set_random_seed(request.get("seed", 0))
            system = pipeline if request.get("batched") else model
            result = measure_module.measure(system, np.load(request["audio"]), **request["options"])
            answer = {
                "whole": result.whole_seconds,
                "encode": result.encode_seconds,
                "decode": result.decode_seconds,
                "tokens": result.tokens,
                "text": result.text,
                "temperatures": result.temperatures,
                "words": result.words,
            }
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
