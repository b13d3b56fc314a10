"""Batch invariance of stock CTranslate2 on this CPU: each window decoded alone, then inside
random batches of windows of other recordings, tokens, scores and no-speech probabilities
compared exactly (vLLM's "needle" check), with the decode's speed-up from batching.

Stock ctranslate2 4.8.5 (the worker's engine), tcmalloc preloaded, faster-whisper's own first
window prompt (timestamps on), ``suppress_blank``, ``suppress_tokens=[-1]``; each window
encoded alone, as the worker encodes it. The windows are the first 30 s of the clips of a
speech set.

    python bench/batch_invariance.py --compute-types int8 float32 --threads 1 2 --beams 1 5 \\
        --out bench/results/batching/invariance.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def child(model_path: str, files: list, compute_type: str, threads: int, beam: int, sizes: list) -> dict:
    """One setting's check (stock ctranslate2 on the path: a process of its own)."""
    import random

    import ctranslate2
    import numpy as np
    from faster_whisper import WhisperModel, decode_audio
    from faster_whisper.tokenizer import Tokenizer
    from faster_whisper.transcribe import get_suppressed_tokens

    assert not hasattr(ctranslate2.models.Whisper, "forward_batch"), "not stock ctranslate2"
    whisper = WhisperModel(model_path, compute_type=compute_type, cpu_threads=threads)
    tokenizer = Tokenizer(whisper.hf_tokenizer, whisper.model.is_multilingual, task="transcribe", language="en")
    encoded = []
    for path in files:
        features = whisper.feature_extractor(decode_audio(path)[: 30 * 16000])[:, :3000]
        features = np.pad(features, ((0, 0), (0, 3000 - features.shape[1])))[None].astype(np.float32)
        encoded.append(np.array(whisper.model.encode(ctranslate2.StorageView.from_array(features))))
    prompt = whisper.get_prompt(tokenizer, [], without_timestamps=False)
    options = dict(
        beam_size=beam,
        patience=1,
        length_penalty=1,
        max_length=448,
        return_scores=True,
        return_no_speech_prob=True,
        suppress_blank=True,
        suppress_tokens=get_suppressed_tokens(tokenizer, [-1]),
        max_initial_timestamp_index=50,
    )

    def decode(indices):
        stacked = ctranslate2.StorageView.from_array(
            np.ascontiguousarray(np.concatenate([encoded[i] for i in indices]))
        )
        started = time.perf_counter()
        results = whisper.model.generate(stacked, [prompt] * len(indices), **options)
        return [(r.sequences_ids, r.scores, r.no_speech_prob) for r in results], time.perf_counter() - started

    alone, alone_seconds = {}, 0.0
    for index in range(len(encoded)):
        (alone[index],), seconds = decode([index])
        alone_seconds += seconds
    rng = random.Random(0)
    by_size = {}
    for size in sizes:
        order = list(range(len(encoded)))
        rng.shuffle(order)
        same_tokens = same_all = rows = 0
        seconds = 0.0
        for start in range(0, len(order) - size + 1, size):
            batch = order[start : start + size]
            outcomes, spent = decode(batch)
            seconds += spent
            for index, outcome in zip(batch, outcomes):
                rows += 1
                same_tokens += outcome[0] == alone[index][0]
                same_all += outcome == alone[index]
        by_size[str(size)] = {
            "rows": rows,
            "tokens_identical": same_tokens,
            "tokens_scores_identical": same_all,
            "decode_speedup": (alone_seconds * rows / len(encoded)) / seconds if seconds else None,
        }
    return {"compute_type": compute_type, "threads": threads, "beam_size": beam, "by_batch_size": by_size}


def main() -> None:
    from ct2_flash.benchmark.manifest import read_manifest
    from ct2_flash.benchmark.scripts import machine, write_result
    from ct2_flash.benchmark.speech_sets import fetch
    from ct2_flash.benchmark.stock import stock_environment
    from ct2_flash.engine.models import resolve_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--speech-set", default="mfa")
    parser.add_argument("--windows", type=int, default=48)
    parser.add_argument("--compute-types", nargs="+", default=["int8"])
    parser.add_argument("--threads", nargs="+", type=int, default=[2])
    parser.add_argument("--beams", nargs="+", type=int, default=[1, 5])
    parser.add_argument("--sizes", nargs="+", type=int, default=[4, 8, 16])
    parser.add_argument("--out", default="bench/results/batching/invariance.json")
    args = parser.parse_args()
    files = [u.path for u in read_manifest(fetch(args.speech_set))][: args.windows]
    model = resolve_model(args.model)
    settings = []
    with tempfile.TemporaryDirectory() as work:
        out = os.path.join(work, "setting.json")
        for compute_type in args.compute_types:
            for threads in args.threads:
                for beam in args.beams:
                    job = json.dumps([model, files, compute_type, threads, beam, args.sizes])
                    argv = [sys.executable, os.path.abspath(__file__), "--child", job, out]
                    subprocess.run(argv, env=stock_environment(tuned=True), check=True)
                    with open(out, encoding="utf-8") as stream:
                        settings.append(json.load(stream))
                    print(json.dumps(settings[-1]), file=sys.stderr)
    document = {
        "machine": machine(),
        "command": " ".join(sys.argv),
        "model": args.model,
        "speech_set": args.speech_set,
        "windows": len(files),
        "settings": settings,
    }
    write_result(args.out, document)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        result = child(*json.loads(sys.argv[2]))
        with open(sys.argv[3], "w", encoding="utf-8") as stream:
            json.dump(result, stream)
    else:
        main()
