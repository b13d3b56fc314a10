"""How close the loop's token scores are to CTranslate2's own, per engine ISA.

faster-whisper decides its temperature fallback from window scores, so the loop scores rows with
the engine's arithmetic (``ct2_flash/loop/row_scores.py``). This measures it: on the first
30 s of committed clips (tiny.en, float32, greedy, no timestamps), per-token scores of
``generate()`` (from its cumulative scores at growing lengths) against the loop's (single-step
rows through the logit rules and ``row_scores``), and against exact arithmetic (float64), with
the engine at its own ISA choice and forced to each other one (``CT2_FORCE_CPU_ISA``, one
child process each, since the engine reads it when it loads). It also records what the
first-call check (``row_scores.confirm_isa``) kept.

    python bench/studies/score_accuracy.py --out bench/results/score_accuracy/score_accuracy.json
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys

import numpy as np

from ct2_flash.benchmark.scripts import TEST_CLIPS, write_result

CLIPS = 6
TOKENS = 20
FORCED = (None, "AVX2", "AVX512", "GENERIC")


def measure() -> dict:
    """Per-token score differences in this process (its engine ISA as the environment sets it)."""
    from faster_whisper import decode_audio

    from ct2_flash import FlashWhisperModel
    from ct2_flash.loop import row_scores
    from ct2_flash.loop.options import DecodingOptions

    flash = FlashWhisperModel("tiny.en", compute_type="float32", cpu_threads=2, stock_engine=False)
    decoder, reference = flash.decoder, flash.reference_model
    prompt = [decoder.runtime.special.sot, decoder.runtime.special.no_timestamps]
    to_engine, exact_to_engine = [], []
    clips = sorted(glob.glob(os.path.join(TEST_CLIPS, "clip*.ogg")))[:CLIPS]
    for path in clips:
        window = flash.encode_window(decode_audio(path)[: 30 * 16000])
        if not row_scores.isa_confirmed():
            decoder.confirm_score_isa(window, prompt)
        tokens = reference.generate(window, [prompt], beam_size=1, max_length=2 * TOKENS)[0].sequences_ids[0][:TOKENS]
        cumulative = [0.0]
        for steps in range(1, len(tokens) + 1):  # min(max_length // 2, max_length - 1) steps
            result = reference.generate(window, [prompt], beam_size=1, max_length=2 * steps, return_scores=True)[0]
            cumulative.append(result.scores[0] * steps)
        engine = np.diff(cumulative)
        prefill = decoder.runtime.start(window, prompt)
        rows = np.stack([prefill.next_logits, *(prefill.sequence.verify([token])[0] for token in tokens[:-1])])
        block = decoder.rules_for(prompt, DecodingOptions()).choose_block(rows, [], tokens[:-1])
        ours = block.log_probs(tokens)
        edited = block.edited[: len(tokens)].astype(np.float64)
        peak = edited.max(axis=1)
        exact = edited[np.arange(len(tokens)), tokens] - peak - np.log(np.exp(edited - peak[:, None]).sum(axis=1))
        to_engine += list(np.abs(ours - engine))
        exact_to_engine += list(np.abs(exact - engine))
    return {
        "forced_isa": os.environ.get("CT2_FORCE_CPU_ISA"),
        "isa_kept": row_scores.engine_isa(),
        "clips": len(clips),
        "tokens": len(to_engine),
        "loop_to_engine": {"mean": float(np.mean(to_engine)), "max": float(np.max(to_engine))},
        "exact_to_engine": {"mean": float(np.mean(exact_to_engine)), "max": float(np.max(exact_to_engine))},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="bench/results/score_accuracy/score_accuracy.json")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure()))
        return
    runs = []
    for isa in FORCED:
        env = {key: value for key, value in os.environ.items() if key != "CT2_FORCE_CPU_ISA"}
        if isa:
            env["CT2_FORCE_CPU_ISA"] = isa
        child = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--child"], env=env, capture_output=True, text=True
        )
        if child.returncode != 0:  # CTranslate2 aborts on an ISA the CPU lacks
            runs.append({"forced_isa": isa, "failed": child.stderr.strip().splitlines()[-1:]})
            continue
        runs.append(json.loads(child.stdout.strip().splitlines()[-1]))
    write_result(args.out, {"model": "tiny.en", "compute_type": "float32", "runs": runs}, echo=("runs",))


if __name__ == "__main__":
    main()
