"""What asking a drafter for fewer rows buys: the adaptive loop's row choice against K rows.

A drafter with causal blocks proposes the first k of its K drafts exactly when asked for k, and
its proposal costs less with fewer rows. The adaptive loop then asks for the rows likely to
pay (``DraftLengths.rows``). This runs the same utterances twice per repeat with the same
drafter and the adaptive loop: once with that choice, once asking for all K rows every round.
Both arms draft every round (the in-window draft pause and the per-call routing to
``generate()`` are held on, so that both decode the same rounds); greedy, timestamps on,
temperature 0. Writes JSON: decode time, proposal time per round, rows per round, tokens per
target call, and whether the transcripts matched; and, first, the proposal timed alone for
1 .. K rows (median of repeated calls on one real window after 60 of its tokens).

    python bench/studies/draft_rows.py --drafter DIR --out bench/results/draft_rows/DRAFTER.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

# Sibling scripts (python puts this directory first on the path when a script runs).
from ct2_flash.benchmark.scripts import machine, median_ms, time_calls, write_result
from ct2_flash.loop.draft_lengths import DraftLengths


def proposal_alone_ms(flash, drafter, audio, repeats: int = 200) -> dict:
    """Median ms of ``drafter.propose`` for 1 .. K drafts, on ``audio``'s first window after
    the first 60 tokens the target decodes (their states as history), reading the audio window
    around frame 150, nothing else running."""
    import numpy as np

    from ct2_flash.drafting.base import DraftWindow
    from ct2_flash.loop.options import DecodingOptions

    runtime = flash.decoder.runtime
    encoder_output = flash.encode_window(audio)
    prompt = [runtime.special.sot, runtime.special.no_timestamps]
    tokens = list(flash.reference_model.generate(encoder_output, [prompt], beam_size=1)[0].sequences_ids[0][:60])
    prefill = runtime.start(encoder_output, prompt)
    states = runtime.decoder_states(np.concatenate([prefill.next_logits[None], prefill.sequence.verify(tokens[:-1])]))
    drafter.begin(DraftWindow(np.asarray(encoder_output)[0], tuple(prompt), DecodingOptions(), runtime.special.eot))
    drafter.advance(states, len(prompt) + len(tokens) - 1)
    # As in the loop, the round reads the frames around where the target reads (the default
    # window: 225 frames here), not all 1,500.
    drafter.observe_position(150)
    return {
        rows: median_ms(lambda rows=rows: drafter.propose(tokens, rows), repeats, warmup=10)
        for rows in range(1, drafter.num_draft_tokens + 1)
    }


class AllRows(DraftLengths):
    """Asks the drafter for every row it may (the drafts verified still follow costs)."""

    def rows(self, limit: int) -> int:
        return limit


def main() -> None:
    from ct2_flash import Adaptive, FlashWhisperModel, resolve_model
    from ct2_flash.benchmark.manifest import read_manifest
    from ct2_flash.benchmark.runner import load_audio
    from ct2_flash.benchmark.speech_sets import fetch
    from ct2_flash.drafting.onnx_drafter import OnnxDrafter

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drafter", required=True, help="a converted drafter trained with causal blocks")
    parser.add_argument("--speech-sets", nargs="+", default=["mfa", "pocketsphinx"])
    parser.add_argument("--every", type=int, default=3, help="use every n-th utterance of the sets")
    parser.add_argument("--compute-types", nargs="+", default=["float32", "int8"])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    utterances = [u for name in args.speech_sets for u in read_manifest(fetch(name, ""))][:: args.every]
    audio = load_audio(utterances)
    model_path = resolve_model("tiny.en")
    # Both arms draft every round of every call (no pauses: a window DraftPause stopped would
    # decode plain steps in one arm and not the other); only the draft lengths follow costs.
    lengths_only = Adaptive(route_calls=False, pause_drafting=False, draft_lengths=True)
    document = {
        "what": __doc__.split("\n")[0],
        "drafter": os.path.abspath(args.drafter),
        "utterances": len(utterances),
        "speech_sets": args.speech_sets,
        "every": args.every,
        "threads": args.threads,
        "repeats": args.repeats,
        "machine": machine(),
        "results": {},
    }
    for compute_type in args.compute_types:
        flash = FlashWhisperModel(
            model_path,
            stock_engine=False,
            compute_type=compute_type,
            cpu_threads=args.threads,
            near_exact=True,
            redecodes=False,
        )
        drafter = OnnxDrafter(args.drafter, model_path)
        if not drafter.proposes_prefixes:
            parser.error(f"{args.drafter} was not trained with causal blocks: it always computes K rows")
        proposal_seconds = []
        if "proposal_alone_ms_by_rows" not in document:
            document["proposal_alone_ms_by_rows"] = proposal_alone_ms(flash, drafter, audio[utterances[0].path])
            print(
                "proposal alone, ms by rows:",
                {k: round(v, 2) for k, v in document["proposal_alone_ms_by_rows"].items()},
            )
        time_calls(drafter, "propose", proposal_seconds.append)
        arms = {"all K rows": AllRows, "rows the policy chooses": DraftLengths}
        runs = {name: [] for name in arms}
        texts = {}
        with flash.use_drafter(drafter, adaptive=lengths_only):
            list(flash.transcribe(audio[utterances[0].path], beam_size=1, temperature=0.0)[0])  # warm-up
        for _ in range(args.repeats):
            for name, lengths in arms.items():
                with flash.use_drafter(drafter, adaptive=lengths_only, lengths=lengths()):  # each arm learns afresh
                    flash.reset_spec_stats()
                    proposal_seconds.clear()
                    texts[name] = [
                        " ".join(s.text for s in flash.transcribe(audio[u.path], beam_size=1, temperature=0.0)[0])
                        for u in utterances
                    ]
                    stats = flash.spec_stats
                    runs[name].append(
                        {
                            "decode_seconds": stats.decode_seconds,
                            "drafter_seconds": stats.drafter_seconds,
                            "verify_seconds": stats.verify_seconds,
                            "other_seconds": stats.other_seconds,
                            "rounds": stats.draft_rounds,
                            "rows_per_round": stats.drafted_rows / max(stats.draft_rounds, 1),
                            "proposal_ms": 1e3 * statistics.fmean(proposal_seconds) if proposal_seconds else 0.0,
                            "target_calls": stats.target_calls,
                            "tokens_per_target_call": stats.tokens_per_call,
                            "acceptance_rate": stats.acceptance_rate,
                            "rows_rechecked": stats.rows_rechecked,
                        }
                    )
        base = [run["decode_seconds"] for run in runs["all K rows"]]
        chosen = [run["decode_seconds"] for run in runs["rows the policy chooses"]]
        document["results"][compute_type] = {
            "runs": runs,
            "identical_transcripts": texts["all K rows"] == texts["rows the policy chooses"],
            "decode_speedup_per_repeat": [b / c for b, c in zip(base, chosen)],
        }
        print(
            compute_type,
            json.dumps(document["results"][compute_type]["decode_speedup_per_repeat"]),
            {name: round(statistics.fmean(r["proposal_ms"] for r in values), 2) for name, values in runs.items()},
        )
    write_result(args.out, document)


if __name__ == "__main__":
    main()
