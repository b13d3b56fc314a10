"""Runs faster-whisper on stock ctranslate2, as users install it today: in a stock environment,
or in ct2-flash's own with the stock engine's directory first on ``PYTHONPATH``.

Not imported by ct2_flash, and imports nothing from it (that would load the patched runtime,
or, in a stock environment, is not there). It reads JSON requests from stdin, one per line, and answers
each with one JSON line on stdout:

    {"model": DIR, "compute_type": "int8", "threads": 2}          -> {"ready": true, "ctranslate2": "4.8.5"}
    {"audio": "clip.npy", "options": {"beam_size": 1}, "seed": 0}  -> {"whole": s, "encode": s, "decode": s,
                                                                       "tokens": [[...]], "text": "..."}

A request with ``"batched": true`` runs faster-whisper's ``BatchedInferencePipeline`` around the
same model (``options`` carry its ``batch_size``).

Timing is ``ct2_flash/benchmark/measure.py`` itself, loaded by file path so both environments measure
the same way.
"""

import importlib.util
import json
import os
import sys


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
            model = WhisperModel(request["model"], compute_type=request["compute_type"], cpu_threads=request["threads"])
            pipeline = BatchedInferencePipeline(model)
            answer = {"ready": True, "ctranslate2": ctranslate2.__version__}
        else:
            ctranslate2.set_random_seed(request.get("seed", 0))
            system = pipeline if request.get("batched") else model
            result = measure_module.measure(system, np.load(request["audio"]), **request["options"])
            answer = {"whole": result.whole_seconds, "encode": result.encode_seconds, "decode": result.decode_seconds,
                      "tokens": result.tokens, "text": result.text, "temperatures": result.temperatures}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
