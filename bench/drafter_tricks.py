"""What each cheap-drafting trick costs in acceptance and buys in time, in the real loop.

Every variant of the trained drafter (precision, draft-head shortlist, confidence cut) decodes
the same held-out audio through ``FlashWhisperModel.transcribe`` next to plain faster-whisper
greedy, interleaved per clip after a warm-up; reported per variant: acceptance rate, tokens
per target call, first-position acceptance, drafter ms per round, verification ms per call,
and the decode-part speedup (ratio of summed generate() times).

    python bench/drafter_tricks.py --drafter DIR --manifest TSV [--compute-type int8] [--limit 12]

With ``--checkpoint NAME=DIR`` (repeatable) it compares checkpoints instead of tricks, each
at the default settings: the ablations of the paper's Table 3.
"""

from __future__ import annotations

import argparse
import json
import os
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    from faster_whisper import WhisperModel
    from tqdm import tqdm

    from ct2_flash import FlashWhisperModel, resolve_model
    from ct2_flash.benchmark.manifest import read_manifest
    from ct2_flash.benchmark.runner import load_audio
    from ct2_flash.cli import parse_decoder_threads
    from ct2_flash.flash_drafter import FlashDrafter, load_checkpoint
    from ct2_flash.measure import measure

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drafter", help="checkpoint whose tricks are compared")
    parser.add_argument("--checkpoint", action="append", default=[], help="NAME=DIR, compared at default settings")
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--compute-type", default="int8")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--limit", type=int, default=12)
    # The guard (int8 default 2.0) re-decides close rows with extra single passes; it would
    # hide what the drafter itself proposes and accepts, so the drafter is compared without it.
    parser.add_argument("--guard-margin", type=float, default=0.0)
    parser.add_argument("--decoder-threads", default="auto", help="'auto', 'none' or an int")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "drafter_tricks.json"))
    args = parser.parse_args()

    path = resolve_model("tiny.en")
    if args.checkpoint:
        pairs = [item.split("=", 1) for item in args.checkpoint]
        # Full K every round, no governor: the networks are compared, not the policies.
        drafters = {name: FlashDrafter(load_checkpoint(directory, path), min_confidence=0.0) for name, directory in pairs}
        adaptive = set()
    elif args.drafter:
        model = load_checkpoint(args.drafter, path)
        variants = {
            "float32, full vocabulary": dict(precision="float32", use_shortlist=False, min_confidence=0.0),
            "float32, shortlist": dict(precision="float32", min_confidence=0.0),
            "bfloat16, shortlist": dict(precision="bfloat16", min_confidence=0.0),
            "int8 weights, shortlist, 2 torch threads": dict(precision="int8", threads=2, min_confidence=0.0),
            "int8 weights, shortlist, float32 encoder keys": dict(precision="int8", min_confidence=0.0, bfloat16_keys=False),
            "int8 weights, shortlist": dict(precision="int8", min_confidence=0.0),
            "int8 weights, shortlist, confidence >= 0.1": dict(precision="int8", min_confidence=0.1),
            "int8 weights, shortlist, confidence >= 0.3": dict(precision="int8", min_confidence=0.3),
            "int8 weights, shortlist, confidence >= 0.1, governor (the default)": dict(precision="int8", adaptive=True),
        }
        adaptive = {name for name, options in variants.items() if options.pop("adaptive", False)}
        drafters = {name: FlashDrafter(model, **options) for name, options in variants.items()}
    else:
        parser.error("give --drafter or --checkpoint")
    baseline = WhisperModel(path, compute_type=args.compute_type, cpu_threads=args.threads)
    flash = FlashWhisperModel(path, compute_type=args.compute_type, cpu_threads=args.threads,
                              drafter=next(iter(drafters.values())), guard_margin=args.guard_margin,
                              decoder_threads=parse_decoder_threads(args.decoder_threads))
    utterances = read_manifest(args.manifest)[: args.limit]
    audio = load_audio(utterances)
    options = dict(beam_size=1)
    first = audio[utterances[0].path]
    measure(baseline, first, **options)
    for name, drafter in drafters.items():
        flash.model.decoder.drafter, flash.model.decoder.adaptive = drafter, name in adaptive
        measure(flash, first, **options)

    totals = {name: {"decode": 0.0, "drafter": 0.0, "verify": 0.0, "rounds": 0, "calls": 0, "emitted": 0,
                     "proposed": 0, "accepted": 0, "first_proposed": 0, "first_accepted": 0, "identical": 0}
              for name in drafters}
    baseline_decode = 0.0
    started = time.time()
    for utterance in tqdm(utterances, desc="clips"):
        samples = audio[utterance.path]
        reference = measure(baseline, samples, **options)
        baseline_decode += reference.decode_seconds
        for name, drafter in drafters.items():
            # Every round drafts, except in the variant that shows the governor.
            flash.model.decoder.drafter, flash.model.decoder.adaptive = drafter, name in adaptive
            flash.reset_spec_stats()
            got = measure(flash, samples, **options)
            stats, total = flash.spec_stats, totals[name]
            total["decode"] += got.decode_seconds
            total["drafter"] += stats.drafter_seconds
            total["verify"] += stats.verify_seconds
            total["rounds"] += stats.draft_rounds
            total["calls"] += stats.target_calls
            total["emitted"] += stats.emitted
            total["proposed"] += stats.proposed
            total["accepted"] += stats.accepted
            total["first_proposed"] += stats.proposed_by_position[0] if stats.proposed_by_position else 0
            total["first_accepted"] += stats.accepted_by_position[0] if stats.accepted_by_position else 0
            total["identical"] += got.tokens == reference.tokens
    report = {}
    for name, total in totals.items():
        report[name] = {
            "acceptance_rate": total["accepted"] / max(1, total["proposed"]),
            "first_position_acceptance": total["first_accepted"] / max(1, total["first_proposed"]),
            "proposed_per_round": total["proposed"] / max(1, total["rounds"]),
            "tokens_per_target_call": total["emitted"] / max(1, total["calls"]),
            "drafter_ms_per_round": 1000 * total["drafter"] / max(1, total["rounds"]),
            "verify_ms_per_call": 1000 * total["verify"] / max(1, total["calls"]),
            "decode_speedup": baseline_decode / total["decode"],
            "identical": f"{total['identical']}/{len(utterances)}",
        }
    document = {"drafter": args.drafter, "checkpoints": args.checkpoint, "manifest": args.manifest, "clips": len(utterances),
                "compute_type": args.compute_type, "threads": args.threads, "guard_margin": args.guard_margin,
                "decoder_threads": args.decoder_threads,
                "baseline_decode_seconds": baseline_decode, "wall_seconds": time.time() - started, "variants": report}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as stream:
        json.dump(document, stream, indent=2)
    for name, row in report.items():
        print(f"{name:42s} acc {row['acceptance_rate']:.1%} first {row['first_position_acceptance']:.1%} "
              f"tok/call {row['tokens_per_target_call']:.2f} drafter {row['drafter_ms_per_round']:.1f} ms "
              f"verify {row['verify_ms_per_call']:.1f} ms decode {row['decode_speedup']:.2f}x {row['identical']}")


if __name__ == "__main__":
    main()
