"""What the stock engine's worker costs in memory, and what keeping freed memory buys: per model
and compute type, with the worker's C library keeping what the engine frees (the default:
``worker.keep_freed_memory``) and without, its resident size loaded, after one 30 s window, and
over a soak of real windows (every test clip, the long one cut into 30 s windows, ``--rounds``
times: encode, greedy and beam ``generate()``, ``align()``), with page faults and the worker's
encoder time per window from the same run.

    python bench/studies/stock_worker_memory.py --out bench/results/stock_worker/memory.json
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics

import numpy as np
from faster_whisper import decode_audio
from faster_whisper.feature_extractor import FeatureExtractor

from ct2_flash import resolve_model
from ct2_flash.benchmark.scripts import TEST_CLIPS, write_result
from ct2_flash.engine.models import available_models
from ct2_flash.loop.vocabulary import load_config, load_vocabulary
from ct2_flash.stock.client import StockEngine

WINDOW = 3000  # mel frames: 30 s


def status_mb(pid: int, field: str) -> float:
    """VmRSS (resident now) or VmHWM (the most it was) of a process, in MB."""
    with open(f"/proc/{pid}/status", encoding="utf-8") as status:
        line = next(line for line in status if line.startswith(field))
    return int(line.split()[1]) / 1024


def minor_faults(pid: int) -> int:
    with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[7])


def windows(mels: int) -> list:
    """[1, mels, 3000] float32 features of every test clip's 30 s windows (padded)."""
    extractor = FeatureExtractor(feature_size=mels)
    out = []
    for path in sorted(glob.glob(os.path.join(TEST_CLIPS, "*.ogg"))):
        features = extractor(decode_audio(path))
        for start in range(0, features.shape[1], WINDOW):
            window = features[:, start : start + WINDOW]
            out.append(np.pad(window, ((0, 0), (0, WINDOW - window.shape[1])))[None].astype(np.float32))
    return out


def soak(engine: StockEngine, features: list, rounds: int, start_token: int) -> dict:
    pid = engine._process.pid  # noqa: SLF001
    resident, encode_seconds, faults = [], [], []
    for _ in range(rounds):
        for window in features:
            before_faults, before = minor_faults(pid), engine.timings.get("encode", [0, 0.0, 0.0])[2]
            encoding = engine.encode(window)
            encode_seconds.append(engine.timings["encode"][2] - before)
            greedy = engine.generate(encoding, [[start_token]], {"beam_size": 1, "max_length": 224})[0]
            engine.generate(encoding, [[start_token]], {"beam_size": 5, "max_length": 224})
            if greedy.sequences_ids[0]:
                engine.align(encoding, [start_token], [greedy.sequences_ids[0]], [1500])
            faults.append(minor_faults(pid) - before_faults)
        resident.append(round(status_mb(pid, "VmRSS")))
    return {
        "resident_mb_after_each_round": resident,
        "peak_mb": round(status_mb(pid, "VmHWM")),
        "minor_faults_per_window": statistics.median(faults),
        "encode_seconds_per_window": statistics.median(encode_seconds),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--rounds", type=int, default=3, help="passes over the windows in the soak")
    args = parser.parse_args()
    rows = []
    for name in [model for model in ("tiny.en", "base") if model in available_models()]:
        path = resolve_model(name)
        mels = int(load_config(path).get("num_mel_bins", 80))
        features = windows(mels)
        start_token = load_vocabulary(path)[0].sot
        for compute_type in ("float32", "int8_float32"):
            for keep in (True, False):
                engine = StockEngine(path, compute_type, 2, keep_freed_memory=keep)
                try:
                    engine._ensure_started()  # noqa: SLF001  (loaded, nothing asked yet)
                    loaded = status_mb(engine._process.pid, "VmRSS")  # noqa: SLF001
                    engine.encode(features[0])
                    one = status_mb(engine._process.pid, "VmRSS")  # noqa: SLF001
                    row = {
                        "model": name,
                        "compute_type": compute_type,
                        "keep_freed_memory": engine.keeps_freed_memory,
                        "loaded_mb": round(loaded),
                        "after_one_encode_mb": round(one),
                        "windows": len(features),
                        **soak(engine, features, args.rounds, start_token),
                    }
                finally:
                    engine.close()
                rows.append(row)
                print(row, flush=True)
    write_result(
        args.out,
        {
            "what": "the stock engine's worker: resident memory (VmRSS, VmHWM), minor page faults "
            "and encoder seconds per 30 s window, keeping freed memory or not",
            "rounds": args.rounds,
            "rows": rows,
        },
    )


if __name__ == "__main__":
    main()
