"""How far a verified row is from the single step greedy decoding computes, by block position.

The guard (``FlashWhisperModel(guard_margin=...)``) re-decides a row of a multi-token pass
with a single-token pass when the row's choice is closer than the margin. The margin only has
to exceed how far a row's decision can move against a single step's. This script measures
that on real speech, in the loop, with its real cache history:

1. the loop runs with an oracle drafter that injects errors (25%: blocks are accepted, cut
   and rolled back as in use), no guard, drafting every round; every verification's tokens,
   cache length and raw rows are recorded;
2. the same window is replayed with single-token passes along the loop's output (what plain
   greedy decoding computes);
3. for every verified row whose tokens so far are the output's, the decision-relevant
   deviation is |(row[a] - row[b]) - (step[a] - step[b])|, with a the single step's choice
   and b the row's choice when it differs, else the single step's runner-up (after the logit
   rules on both).

The margin per block position is the largest deviation seen there times ``--safety``; it is
written to the package's table (``ct2_flash/data/guard_margins.json``, with ``--write``) for
this model and compute type, which ``FlashWhisperModel`` uses by default. It then measures the
identity rate and the rechecks with the derived margins against the fixed 2.0 logits used
before, with the shipped drafter. Writes JSON and a plot.

    python bench/guard_margin.py --compute-type int8 --limit 40 --out bench/results/guard_margin/int8.json --write
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from collections import defaultdict

import numpy as np


def _record_verifications(runtime, calls: list):
    """Patch ``runtime.start`` so that every verification of the sequence it returns is recorded."""
    start = runtime.start

    def recording_start(encoder_output, prompt):
        prefill = start(encoder_output, prompt)
        sequence = prefill.sequence
        verify = sequence.verify

        def recording_verify(tokens):
            length = sequence.length
            rows = verify(tokens)
            calls.append((length, [int(t) for t in tokens], rows.copy()))
            return rows

        sequence.verify = recording_verify
        return prefill

    runtime.start = recording_start


def _single_steps(runtime, encoder_output, prompt, tokens):
    """[len(tokens), vocab] raw rows of single-token passes: row i predicts tokens[i]."""
    prefill = runtime.start(encoder_output, prompt)
    rows = [prefill.next_logits]
    for token in tokens[:-1]:
        rows.append(prefill.sequence.verify([token])[0])
    return np.stack(rows)


def deviations(decoder, encoder_output, prompt, options):
    """(block position, deviation, single step's margin) for every comparable verified row."""
    from ct2_flash.target import PromptLayout

    runtime = decoder.runtime
    calls: list = []
    _record_verifications(runtime, calls)
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
            row, step = rows[j].copy(), steps[index].copy()
            rules.apply(row, context)
            rules.apply(step, context)
            a = int(step.argmax())
            b = int(row.argmax())
            if b == a:
                b = int(np.argsort(step)[-2])
            deviation = abs((row[a] - row[b]) - (step[a] - step[b]))
            margin = float(step[a] - np.sort(step)[-2])
            found.append((j, float(deviation), margin))
    return found


def main() -> None:
    from ct2_flash import FlashWhisperModel, resolve_model
    from ct2_flash.benchmark.manifest import read_manifest
    from ct2_flash.benchmark.runner import load_audio
    from ct2_flash.benchmark.speech_sets import fetch
    from ct2_flash.drafting import GreedyOptions
    from ct2_flash.exactness import compare_window
    from ct2_flash.guard import GUARD_TABLE, derive_margins
    from ct2_flash.testing import OracleDrafter, using_drafter

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--speech-set", nargs="+", default=["mfa", "pocketsphinx"])
    parser.add_argument("--limit", type=int, default=40, help="utterances per speech set")
    parser.add_argument("--compute-type", default="int8")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--safety", type=float, default=1.5, help="margin = largest deviation x this")
    parser.add_argument("--write", action="store_true", help=f"store the margins in {GUARD_TABLE}")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    model_path = resolve_model("tiny.en")
    utterances = [u for name in args.speech_set for u in read_manifest(fetch(name, ""))[: args.limit]]
    audio = load_audio(utterances)
    flash = FlashWhisperModel(model_path, compute_type=args.compute_type, cpu_threads=args.threads,
                              decoder_threads=None, adaptive=False, guard_margin=0.0)
    decoder = flash.model.decoder
    special = decoder.runtime.special
    compute_type = decoder.runtime.model.compute_type  # resolved: int8 is int8_float32 on CPU
    prompts = ([special.sot], [special.sot, special.no_timestamps])
    found = []
    with using_drafter(decoder, OracleDrafter(flash.reference_model, error_rate=0.25, seed=3)):
        for utterance in utterances:
            encoder_output = flash.encode_window(audio[utterance.path])
            for prompt in prompts:
                found += deviations(decoder, encoder_output, list(prompt), GreedyOptions())
    by_position = defaultdict(list)
    for position, deviation, _ in found:
        by_position[position].append(deviation)
    k = decoder.num_draft_tokens
    margins = derive_margins({j: max(v) for j, v in by_position.items()}, k + 1, args.safety)
    summary = {j: {"rows": len(v), "median": float(np.median(v)), "p99": float(np.quantile(v, 0.99)),
                   "p999": float(np.quantile(v, 0.999)), "max": float(max(v))} for j, v in sorted(by_position.items())}
    print("deviation by block position:", json.dumps(summary, indent=1))
    print("derived margins:", margins)

    # Identity and rechecks with the shipped drafter: derived margins against the fixed 2.0.
    evaluation = {}
    for name, guard in (("fixed 2.0", 2.0), ("derived", tuple(margins))):
        decoder.guard_margin = guard
        flash.reset_spec_stats()
        identical = total = 0
        for utterance in utterances:
            encoder_output = flash.encode_window(audio[utterance.path])
            for prompt in prompts:
                identical += compare_window(decoder, encoder_output, list(prompt), GreedyOptions()).identical
                total += 1
        stats = flash.spec_stats
        evaluation[name] = {"windows": total, "identical": identical, "target_calls": stats.target_calls,
                            "rows_rechecked": stats.rows_rechecked,
                            "recheck_share_of_calls": stats.rows_rechecked / max(1, stats.target_calls),
                            "tokens_per_target_call": stats.tokens_per_call}
        print(name, evaluation[name])

    document = {"what": "verified row vs single step: decision-relevant deviation by block position (logits)",
                "model": "tiny.en", "compute_type": compute_type, "speech_sets": args.speech_set,
                "utterances": len(utterances), "rows": len(found), "safety": args.safety,
                "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "flags": _cpu_flags()},
                "deviation_by_position": summary, "margins": margins, "evaluation": evaluation}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as stream:
        json.dump(document, stream, indent=2)
    _plot(by_position, margins, args.out.rsplit(".", 1)[0] + ".png", args.compute_type)
    if args.write:
        from ct2_flash.guard import write_margins

        write_margins("tiny.en", decoder.runtime.model.compute_type, margins, f"bench/guard_margin.py, {len(utterances)} real utterances, "
                      f"{len(found)} rows, max deviation x {args.safety}")


def _cpu_flags() -> list:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as stream:
            flags = next(line for line in stream if line.startswith("flags")).split(":")[1].split()
    except (OSError, StopIteration):
        return []
    return sorted(f for f in flags if f.startswith(("avx", "fma", "amx")))


def _plot(by_position, margins, path: str, compute_type: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6.5, 4))
    positions = sorted(by_position)
    axis.boxplot([by_position[j] for j in positions], positions=positions, whis=(0, 100), widths=0.6)
    axis.plot(range(len(margins)), margins, marker="_", markersize=18, linestyle="", color="tab:red", label="derived margin")
    axis.set_xlabel("row of the verified block (0 = after the anchor)")
    axis.set_ylabel("|row - single step| on the decision (logits)")
    axis.set_title(f"tiny.en {compute_type}: verified rows against single steps", fontsize=9)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


if __name__ == "__main__":
    main()
