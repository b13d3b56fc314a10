"""How far a verified row is from the single step greedy decoding computes, by block position.

The guard (``FlashWhisperModel(guard_margin=...)``) re-decides a row of a multi-token pass
with a single-token pass when the row's choice is closer than the margin. The margin only has
to exceed how far a row's decision can move against a single step's. This script measures
that on real speech, in the loop, with its real cache history:

1. the loop runs, no guard, drafting every round; every verification's tokens, cache length
   and raw rows are recorded;
2. the same window is replayed with single-token passes along the loop's output (what plain
   greedy decoding computes);
3. for every verified row whose tokens so far are the output's, both sides' choices and
   margins are taken as the guard computes them (after the logit rules: the top-2 gap and the
   timestamp-mass rule's margin); the decision-relevant deviation is the difference of the
   margins when the choices agree, and their sum when the row went the other way.

A margin per block row is derived as the largest deviation seen there times ``--safety``.
Then the identity rate against CTranslate2's ``generate()``, the rechecks and the tokens per
target call are measured with the shipped drafter for the derived margins and a ladder of
fixed ones (1.0, 1.5, 2.0, 3.0); the default is the smallest margin with the most identical
windows. Rows are measured with the shipped drafter and with an oracle that injects errors
(their rounds leave different cache histories). Writes JSON and a plot.

    python bench/studies/guard_margin.py --compute-type int8 --limit 30 --out bench/results/guard_margin/int8.json
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import numpy as np

from ct2_flash.benchmark.scripts import machine, record_verifications, save_figure, write_result


def _single_steps(runtime, encoder_output, prompt, tokens):
    """[len(tokens), vocab] raw rows of single-token passes: row i predicts tokens[i]."""
    prefill = runtime.start(encoder_output, prompt)
    rows = [prefill.next_logits]
    for token in tokens[:-1]:
        rows.append(prefill.sequence.verify([token])[0])
    return np.stack(rows)


def deviations(decoder, encoder_output, prompt, options):
    """(block position, deviation, single step's margin) for every comparable verified row."""
    from ct2_flash.loop.target import PromptLayout

    runtime = decoder.runtime
    calls: list = []
    record_verifications(runtime, calls)
    try:
        result = decoder.decode(encoder_output, prompt, options)
    finally:
        del runtime.start
    layout = PromptLayout.of(prompt, runtime.special)
    generated = list(prompt[layout.start_index + 1 :]) + result.tokens[layout.prefix_length :]
    generated += [runtime.special.eot]  # the loop stops on it; rows predict it too
    position_of_first = len(prompt)  # cache position of generated[0]
    steps = _single_steps(runtime, encoder_output, prompt, generated)
    rules = decoder.rules_for(prompt, options)
    found = []
    for length, tokens, rows in calls:
        start = length - position_of_first  # generated index of tokens[0]
        for j in range(len(tokens)):
            index = start + j + 1  # the generated index row j predicts
            if index >= len(generated) or tokens[j] != generated[start + j]:
                break  # a rejected draft: later rows condition on text the output does not have
            context = generated[:index]
            # Each side's choice and how close it came to going another way, exactly as the
            # guard sees it (top-2 gap and the timestamp-mass rule's margin, after the rules).
            row_choice = rules.choose_block(rows[j][None].copy(), context, ())
            step_choice = rules.choose_block(steps[index][None].copy(), context, ())
            row_margin, margin = float(row_choice.margins(1)[0]), float(step_choice.margins(1)[0])
            if row_choice.tokens[0] == step_choice.tokens[0]:
                deviation = abs(row_margin - margin)
            else:  # the row went the other way: it moved across the boundary by both margins
                deviation = row_margin + margin
            if not np.isfinite(deviation):  # a choice with no competitor (one allowed token)
                continue
            found.append((j, float(deviation), margin))
    return found


def derive_margins(largest, rows: int, safety: float) -> list:
    """Margin per block row from the largest deviation measured there (rows never measured get
    the largest; a margin never decreases along the block)."""
    fallback = max(largest.values())
    margins, running = [], 0.0
    for row in range(rows):
        running = max(running, largest.get(row, fallback))
        margins.append(round(running * safety, 4))
    return margins


def main() -> None:
    from ct2_flash import FlashWhisperModel, load_drafter, resolve_model
    from ct2_flash.benchmark.manifest import read_manifest
    from ct2_flash.benchmark.runner import load_audio
    from ct2_flash.benchmark.speech_sets import fetch
    from ct2_flash.drafting.reference import OracleDrafter
    from ct2_flash.loop.options import DecodingOptions
    from ct2_flash.validation.exactness import compare_window

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--speech-set", nargs="+", default=["mfa", "pocketsphinx"])
    parser.add_argument("--limit", type=int, default=40, help="utterances per speech set")
    parser.add_argument("--compute-type", default="int8")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--safety", type=float, default=1.5, help="margin = largest deviation x this")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    model_path = resolve_model("tiny.en")
    utterances = [u for name in args.speech_set for u in read_manifest(fetch(name, ""))[: args.limit]]
    audio = load_audio(utterances)
    # The shipped drafter named: unnamed, a model that runs no call in the loop (int8) loads none.
    shipped = load_drafter(model=model_path, compute_type=args.compute_type)
    flash = FlashWhisperModel(
        model_path,
        stock_engine=False,
        compute_type=args.compute_type,
        cpu_threads=args.threads,
        decoder_threads=None,
        adaptive=False,
        guard_margin=0.0,
        redecodes=False,
        drafter=shipped,
    )
    decoder = flash.decoder
    special = decoder.runtime.special
    compute_type = decoder.runtime.model.compute_type  # resolved: int8 is int8_float32 on CPU
    prompts = ([special.sot], [special.sot, special.no_timestamps])
    found = []
    # The shipped drafter's rounds and an oracle's long accepted blocks leave different cache
    # histories; both count.
    for drafter in (shipped, OracleDrafter(flash.reference_model, error_rate=0.25, seed=3)):
        with decoder.use_drafter(drafter):
            for utterance in utterances:
                encoder_output = flash.encode_window(audio[utterance.path])
                for prompt in prompts:
                    found += deviations(decoder, encoder_output, list(prompt), DecodingOptions())
    by_position = defaultdict(list)
    for position, deviation, _ in found:
        by_position[position].append(deviation)
    k = decoder.num_draft_tokens
    margins = derive_margins({j: max(v) for j, v in by_position.items()}, k + 1, args.safety)
    summary = {
        j: {
            "rows": len(v),
            "median": float(np.median(v)),
            "p99": float(np.quantile(v, 0.99)),
            "p999": float(np.quantile(v, 0.999)),
            "max": float(max(v)),
        }
        for j, v in sorted(by_position.items())
    }
    print("deviation by block position:", json.dumps(summary, indent=1))
    print("derived margins:", margins)

    # Identity and rechecks with the shipped drafter: derived margins against the fixed 2.0.
    evaluation = {}
    candidates = [
        ("derived", tuple(margins)),
        ("fixed 1.0", 1.0),
        ("fixed 1.5", 1.5),
        ("fixed 2.0", 2.0),
        ("fixed 3.0", 3.0),
    ]
    for name, guard in candidates:
        # The margin is a constructor argument: one model per candidate, on the same engine settings.
        flash = FlashWhisperModel(
            model_path,
            stock_engine=False,
            compute_type=args.compute_type,
            cpu_threads=args.threads,
            decoder_threads=None,
            adaptive=False,
            guard_margin=guard,
            redecodes=False,
            drafter=shipped,
        )
        decoder = flash.decoder
        identical = total = 0
        differences = []  # the target's own top-2 margin where a window first differs
        for utterance in utterances:
            encoder_output = flash.encode_window(audio[utterance.path])
            for prompt in prompts:
                comparison = compare_window(decoder, encoder_output, list(prompt), DecodingOptions())
                identical += comparison.identical
                total += 1
                if not comparison.identical:
                    differences.append(round(comparison.reference_margin, 3))
        stats = flash.spec_stats
        evaluation[name] = {
            "guard_margin": guard,
            "windows": total,
            "identical": identical,
            "reference_margins_at_differences": differences,
            "target_calls": stats.target_calls,
            "rows_rechecked": stats.rows_rechecked,
            "recheck_share_of_calls": stats.rows_rechecked / max(1, stats.target_calls),
            "tokens_per_target_call": stats.tokens_per_call,
        }
        print(name, evaluation[name])

    document = {
        "what": "verified row vs single step: decision-relevant deviation by block position (logits)",
        "model": "tiny.en",
        "compute_type": compute_type,
        "speech_sets": args.speech_set,
        "utterances": len(utterances),
        "rows": len(found),
        "safety": args.safety,
        "machine": machine(),
        "deviation_by_position": summary,
        "margins": margins,
        "evaluation": evaluation,
    }
    write_result(args.out, document)
    _plot(by_position, margins, args.out.rsplit(".", 1)[0] + ".png", args.compute_type)
    best = max(result["identical"] for result in evaluation.values())
    print(
        "smallest margin with the most identical windows:",
        next(name for name, _ in candidates if evaluation[name]["identical"] == best),
    )


def _plot(by_position, margins, path: str, compute_type: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6.5, 4))
    positions = sorted(by_position)
    axis.boxplot([by_position[j] for j in positions], positions=positions, whis=(0, 100), widths=0.6)
    axis.plot(
        range(len(margins)), margins, marker="_", markersize=18, linestyle="", color="tab:red", label="derived margin"
    )
    axis.set_xlabel("row of the verified block (0 = after the anchor)")
    axis.set_ylabel("|row - single step| on the decision (logits)")
    axis.set_title(f"tiny.en {compute_type}: verified rows against single steps", fontsize=9)
    axis.legend(fontsize=8)
    save_figure(figure, path)


if __name__ == "__main__":
    main()
