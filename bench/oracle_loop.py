"""Ceiling of the speculative loop: plain faster-whisper greedy against ct2-flash driven by an
oracle drafter (always right, and right ~60% of the time), on the committed test speech.

The oracle's own reference decoding is done in an untimed warm-up pass and cached, so the
timed passes measure only the loop. Systems are interleaved per clip, three repeats; the
report gives per compute type the decode part (time in generate(): encoder output to last
token) and the whole path (waveform to segments) as ratios of summed times, with acceptance
rate and tokens per target call.

    python bench/oracle_loop.py --out bench/results/oracle_loop.json
    python bench/oracle_loop.py --drafter DIR --systems --out ...   # a trained drafter only
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import statistics
import time
from typing import Optional

from faster_whisper import WhisperModel, decode_audio
from tqdm import tqdm

from ct2_flash import FlashWhisperModel, resolve_model
from ct2_flash.measure import measure
from ct2_flash.testing import OracleDrafter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SYSTEMS = {"oracle-100%": 0.0, "oracle-60%": 0.1}  # error rate per drafted token


def run(compute_type: str, threads: int, repeats: int, k: int, clips: dict, drafter_dir: Optional[str] = None) -> dict:
    path = resolve_model("tiny.en")
    baseline = WhisperModel(path, compute_type=compute_type, cpu_threads=threads)
    flashes = {}
    for name, error_rate in SYSTEMS.items():
        flash = FlashWhisperModel(path, compute_type=compute_type, cpu_threads=threads, num_draft_tokens=k)
        flash.model.decoder.drafter = OracleDrafter(flash.reference_model, error_rate=error_rate, seed=0)
        flashes[name] = flash
    if drafter_dir:  # a trained Whisper-Flash drafter, next to the oracle ceiling
        flashes["whisper-flash"] = FlashWhisperModel(
            path, compute_type=compute_type, cpu_threads=threads, num_draft_tokens=k, drafter=drafter_dir
        )
    options = dict(beam_size=1)
    for audio in clips.values():  # warm-up; fills the oracle caches
        measure(baseline, audio, **options)
        for flash in flashes.values():
            measure(flash, audio, **options)
    for flash in flashes.values():
        flash.reset_spec_stats()

    times = {name: {"decode": 0.0, "whole": 0.0} for name in ["baseline", *flashes]}
    identical = {name: 0 for name in flashes}
    per_clip = []
    for _ in tqdm(range(repeats), desc=f"{compute_type} repeats"):
        for clip, audio in clips.items():
            base = measure(baseline, audio, **options)
            row = {"clip": clip, "baseline_decode": base.decode_seconds}
            times["baseline"]["decode"] += base.decode_seconds
            times["baseline"]["whole"] += base.whole_seconds
            for name, flash in flashes.items():
                got = measure(flash, audio, **options)
                times[name]["decode"] += got.decode_seconds
                times[name]["whole"] += got.whole_seconds
                identical[name] += got.tokens == base.tokens
                row[f"{name}_decode"] = got.decode_seconds
            per_clip.append(row)

    report = {"compute_type": compute_type, "threads": threads, "K": k, "repeats": repeats, "systems": {}}
    for name, flash in flashes.items():
        stats = flash.spec_stats
        report["systems"][name] = {
            "decode_speedup": times["baseline"]["decode"] / times[name]["decode"],
            "whole_path_speedup": times["baseline"]["whole"] / times[name]["whole"],
            "median_clip_decode_speedup": statistics.median(r["baseline_decode"] / r[f"{name}_decode"] for r in per_clip),
            "acceptance_rate": stats.acceptance_rate,
            "tokens_per_target_call": stats.tokens_per_call,
            "accepted_by_position": [a / p for a, p in zip(stats.accepted_by_position, stats.proposed_by_position)],
            "identical_runs": f"{identical[name]}/{repeats * len(clips)}",
            "seconds": times[name],
        }
    report["baseline_seconds"] = times["baseline"]
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "oracle_loop.json"))
    parser.add_argument("--compute-types", nargs="+", default=["float32", "int8"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--drafter", default=None, help="also run a trained drafter checkpoint directory")
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS), help="oracle systems to run")
    args = parser.parse_args()
    for name in list(SYSTEMS):
        if name not in args.systems:
            del SYSTEMS[name]
    paths = sorted(glob.glob(os.path.join(ROOT, "tests", "data", "*.ogg")))
    clips = {os.path.basename(p): decode_audio(p) for p in paths}
    started = time.time()
    results = [run(ct, args.threads, args.repeats, args.k, clips, args.drafter) for ct in args.compute_types]
    document = {
        "what": "plain faster-whisper greedy vs ct2-flash with oracle drafters (and a trained one), tests/data speech",
        "drafter": args.drafter,
        "audio_seconds": sum(a.size for a in clips.values()) / 16000,
        "clips": len(clips),
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
        "wall_seconds": time.time() - started,
        "results": results,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as stream:
        json.dump(document, stream, indent=2)
    for result in results:
        for name, system in result["systems"].items():
            print(f"{result['compute_type']:8s} {name:12s} decode {system['decode_speedup']:.2f}x "
                  f"whole {system['whole_path_speedup']:.2f}x acceptance {system['acceptance_rate']:.1%} "
                  f"tokens/call {system['tokens_per_target_call']:.2f} identical {system['identical_runs']}")


if __name__ == "__main__":
    main()
