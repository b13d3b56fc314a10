"""Where and why the int8 loop's output leaves faster-whisper's greedy output.

Real clips (the ``mfa`` and ``pocketsphinx`` speech sets) are joined into windows of 20-29 s,
each decoded at int8 with timestamps on and off, every round drafting (no policy, no
draft pause), the default guard, by three drafters (the shipped one, an oracle with 25% injected
errors, a random one), and compared with CTranslate2's ``generate()`` on the same model. Every
verification the loop makes is recorded (cache length, tokens, raw rows). At a window's first
difference the script logs:

- the pass that decided that position: its rows (1: a single-token pass), the row's index,
  how many cache positions before it were written by multi-token passes;
- the loop row's margins and the same from a single-token replay along the reference (the
  computation plain greedy makes): best vs second text logit, best vs second timestamp, the
  timestamp-mass rule's gap, and the guard's threshold for that row;
- how far the loop's row is from the replayed one (largest logit difference).

It also measures how often plain greedy decoding itself comes close to a tie (its own margins,
single steps all along, timestamps on and off): an exact repair that recomputed the cache with
single steps before every close decision would redo the window up to the last of them.

    python bench/studies/int8_differences.py --out bench/results/int8_differences/int8.json
"""

from __future__ import annotations

import argparse
from collections import Counter

import numpy as np

from ct2_flash import FlashWhisperModel, load_drafter, resolve_model
from ct2_flash.benchmark.manifest import read_manifest
from ct2_flash.benchmark.runner import load_audio
from ct2_flash.benchmark.scripts import machine, record_verifications, write_result
from ct2_flash.benchmark.speech_sets import fetch
from ct2_flash.drafting.reference import OracleDrafter, RandomDrafter
from ct2_flash.loop.options import DecodingOptions
from ct2_flash.loop.target import PromptLayout

SAMPLE_RATE = 16000


def joined_windows(speech_sets, shortest: float, longest: float) -> list:
    """Real clips joined in manifest order (0.3 s of silence between) into windows of
    ``shortest``-``longest`` seconds; a clip longer than ``longest`` stands alone, cut."""
    utterances = [u for name in speech_sets for u in read_manifest(fetch(name, ""))]
    audio = load_audio(utterances)
    gap = np.zeros(int(0.3 * SAMPLE_RATE), dtype=np.float32)
    windows, pieces, length = [], [], 0
    for utterance in utterances:
        clip = audio[utterance.path][: int(longest * SAMPLE_RATE)]
        if pieces and length + clip.size > longest * SAMPLE_RATE:
            windows.append(np.concatenate(pieces))
            pieces, length = [], 0
        pieces += [clip, gap]
        length += clip.size + gap.size
        if length >= shortest * SAMPLE_RATE:
            windows.append(np.concatenate(pieces))
            pieces, length = [], 0
    return windows


def decision_margins(rules, row: np.ndarray, context) -> dict:
    """The margins of one row's decision after the logit rules: the best text token against
    the second, the best timestamp against the second, the timestamp-mass rule's gap, and the
    guard's margin (the smallest of the row's top-2 gap and the mass gap)."""
    choice = rules.choose_block(row[None].copy(), context, ())
    edited, begin = choice.edited[0], rules.special.timestamp_begin

    def top_two(values):
        finite = np.sort(values[np.isfinite(values)])
        return float(finite[-1] - finite[-2]) if finite.size >= 2 else None

    return {
        "token": int(choice.tokens[0]),
        "guard_margin": float(choice.margins(1)[0]),
        "text_top2": top_two(edited[:begin]),
        "timestamp_top2": top_two(edited[begin:]),
        "mass_gap": None if not np.isfinite(choice.rule_margins[0]) else float(choice.rule_margins[0]),
    }


def single_steps(runtime, encoder_output, prompt, tokens) -> np.ndarray:
    """[len(tokens) + 1, vocab] raw rows of plain greedy's computation along ``tokens``."""
    prefill = runtime.start(encoder_output, prompt)
    rows = [prefill.next_logits]
    for token in tokens:
        rows.append(prefill.sequence.verify([token])[0].copy())
    return np.stack(rows)


def diagnose(decoder, encoder_output, prompt, reference, speculative, first, passes) -> dict:
    """What decided position ``first`` (an index into the generated tokens) in the loop."""
    runtime, special = decoder.runtime, decoder.runtime.special
    rules = decoder.rules_for(prompt, DecodingOptions())
    layout = PromptLayout.of(prompt, special)
    position_of_first = len(prompt)  # cache position of generated[0] (the first generated token)
    generated = list(prompt[layout.start_index + 1 :]) + speculative[layout.prefix_length :]
    index = first  # generated index of the differing token (the prefix is empty here)
    deciding, written_by = None, {}  # cache position -> rows of the pass that last wrote it
    for length, tokens, rows in passes:
        start = length - position_of_first  # generated index of tokens[0]
        j = index - 1 - start
        if 0 <= j < len(tokens) and tokens[: j + 1] == generated[start : start + j + 1]:
            perturbed = sum(1 for position, count in written_by.items() if position < length and count > 1)
            deciding = (length, tokens, rows, j, perturbed)
        for position in range(length, length + len(tokens)):
            written_by[position] = len(tokens)
    exact = single_steps(runtime, encoder_output, prompt, reference[:index])[index]
    context = generated[:index]
    found = {
        "index": index,
        "reference_token": reference[index] if index < len(reference) else special.eot,
        "loop_token": speculative[index] if index < len(speculative) else special.eot,
        "exact": decision_margins(rules, exact, context),
    }
    if deciding is None:  # decided by the prefill's row (index 0)
        found["pass"] = "prefill"
        return found
    length, tokens, rows, j, perturbed = deciding
    found.update(
        {
            "pass_rows": len(tokens),
            "row": j,
            "cache_positions_before": length - position_of_first,
            "written_by_multi_token_passes": perturbed,
            "guard_threshold": float(decoder._guard_rows[min(j, decoder._guard_rows.size - 1)]),
            "loop_row": decision_margins(rules, rows[j], context),
            "loop_row_vs_exact_max": float(np.abs(rows[j] - exact).max()),
        }
    )
    return found


def close_decisions(decoder, encoded, prompt) -> dict:
    """Plain greedy's own margins (single steps, ``LogitRules.choose``) over the windows: the
    share of positions closer than 0.5, 1 and 2 logits, and where the last position closer
    than 2 lies, as a fraction of its window's tokens (mean)."""
    runtime, special = decoder.runtime, decoder.runtime.special
    rules = decoder.rules_for(prompt, DecodingOptions())
    margins, last_close = [], []
    for encoder_output in encoded:
        prefill = runtime.start(encoder_output, prompt)
        logits, generated, window = prefill.next_logits.copy(), [], []
        while len(generated) < 224:
            token, _, margin = rules.choose(logits, generated)
            generated.append(token)
            window.append(margin)
            if token == special.eot:
                break
            logits = prefill.sequence.verify([token])[0].copy()
        close = np.flatnonzero(np.asarray(window) < 2.0)
        last_close.append((close[-1] + 1) / len(window) if close.size else 0.0)
        margins += window
    margins = np.asarray(margins)
    return {
        "positions": int(margins.size),
        **{f"share_below_{t:g}": float(np.mean(margins < t)) for t in (0.5, 1, 2)},
        "last_below_2_at_fraction_of_window": float(np.mean(last_close)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--speech-set", nargs="+", default=["mfa", "pocketsphinx"])
    parser.add_argument("--windows", type=int, default=0, help="at most this many windows (0: all)")
    parser.add_argument("--compute-type", default="int8")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    windows = joined_windows(args.speech_set, 20.0, 29.0)
    windows = windows[: args.windows] if args.windows else windows
    # The shipped drafter named: unnamed, a model that runs no call in the loop (int8) loads none.
    flash = FlashWhisperModel(
        resolve_model("tiny.en"),
        stock_engine=False,
        compute_type=args.compute_type,
        cpu_threads=args.threads,
        decoder_threads=None,
        adaptive=False,
        redecodes=False,
        drafter=load_drafter(model="tiny.en", compute_type=args.compute_type),
    )
    decoder, special = flash.decoder, flash.decoder.runtime.special
    drafters = {
        "shipped": decoder.drafter,
        "oracle_0.25": OracleDrafter(flash.reference_model, error_rate=0.25, seed=3),
        "random": RandomDrafter(special.vocab_size, seed=5),
    }
    prompts = {"timestamps": [special.sot], "no_timestamps": [special.sot, special.no_timestamps]}
    passes: list = []
    record_verifications(decoder.runtime, passes)
    encoded = [flash.encode_window(window) for window in windows]
    closeness = {name: close_decisions(decoder, encoded, prompt) for name, prompt in prompts.items()}
    print("plain greedy's own close decisions:", closeness, flush=True)
    results, differences = {}, []
    for drafter_name, drafter in drafters.items():
        with decoder.use_drafter(drafter):
            for prompt_name, prompt in prompts.items():
                identical = 0
                for number, encoder_output in enumerate(encoded):
                    reference = list(
                        flash.reference_model.generate(encoder_output, [prompt], **DecodingOptions().generate_kwargs())[
                            0
                        ].sequences_ids[0]
                    )
                    passes.clear()
                    speculative = decoder.decode(encoder_output, prompt, DecodingOptions()).tokens
                    recorded = list(passes)
                    if speculative == reference:
                        identical += 1
                        continue
                    first = next(
                        (i for i, (a, b) in enumerate(zip(reference, speculative)) if a != b),
                        min(len(reference), len(speculative)),
                    )
                    found = diagnose(decoder, encoder_output, prompt, reference, speculative, first, recorded)
                    found.update(
                        {
                            "drafter": drafter_name,
                            "prompt": prompt_name,
                            "window": number,
                            "reference_tokens": len(reference),
                        }
                    )
                    differences.append(found)
                    print(found, flush=True)
                results[f"{drafter_name}/{prompt_name}"] = {"windows": len(encoded), "identical": identical}
                print(drafter_name, prompt_name, results[f"{drafter_name}/{prompt_name}"], flush=True)

    kinds = Counter(
        ("single-token pass" if d.get("pass_rows") == 1 else "multi-token row")
        + (
            " over a cache written by multi-token passes"
            if d.get("written_by_multi_token_passes")
            else " over a single-step cache"
        )
        for d in differences
        if "pass_rows" in d
    )
    document = {
        "what": "first differences of the int8 loop (every round drafting, default guard) from generate(), "
        "with the deciding pass and both sides' margins",
        "model": "tiny.en",
        "compute_type": decoder.runtime.model.compute_type,
        "threads": args.threads,
        "speech_sets": args.speech_set,
        "windows": len(encoded),
        "seconds": [round(w.size / SAMPLE_RATE, 1) for w in windows],
        "guard_margin": decoder.guard_margin,
        "identity": results,
        "greedy_close_decisions": closeness,
        "deciding_pass": dict(kinds),
        "differences": differences,
        "machine": machine(),
    }
    write_result(args.out, document, echo=("identity", "deciding_pass", "greedy_close_decisions"))


if __name__ == "__main__":
    main()
