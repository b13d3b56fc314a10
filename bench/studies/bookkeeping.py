"""Where a verified block's bookkeeping goes, in the loop and replayed with warm caches.

The bookkeeping of a round is what runs outside the engine and the drafter: the logit rules
and the greedy choice over the verified rows, the guard's margins, the scores of the emitted
tokens and the columns the drafter's states are recovered from. This script:

1. runs the loop on real clips (int8, the shipped drafter, every round drafting, timestamps
   on, as faster-whisper's ``transcribe()`` defaults), with each part timed where the loop
   calls it, per target call;
2. replays the same blocks (their raw rows, recorded in step 1) through the same code right
   after one another, so that the rows and the code stay in the caches, to show how much of
   the in-loop cost is the caches the verification left cold.

Pause background jobs first: the two cores are shared.

    python bench/studies/bookkeeping.py --out bench/results/bookkeeping/int8.json
"""

from __future__ import annotations

import argparse
import collections
import os

import numpy as np

from ct2_flash.benchmark.scripts import machine, time_calls, timed, write_result

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--speech-set", default="mfa", help="a speech set of `ct2-flash bench` (fetched once)")
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "bookkeeping", "int8.json"))
    args = parser.parse_args()

    from ct2_flash import FlashWhisperModel
    from ct2_flash.benchmark.manifest import read_manifest
    from ct2_flash.benchmark.speech_sets import fetch
    from ct2_flash.loop import decoding, logit_rules

    utterances = read_manifest(fetch(args.speech_set, ""))[: args.limit]
    model = FlashWhisperModel(
        "tiny.en", stock_engine=False, compute_type="int8", cpu_threads=2, near_exact=True, redecodes=False
    )  # the int8 loop itself
    runtime = model.decoder.runtime
    blocks = []
    accept = decoding._Decoding.accept

    def recording_accept(state, draft, logits):
        blocks.append((logits.copy(), list(state.generated), draft, state.rules, state.strategy))
        return accept(state, draft, logits)

    def transcribe_all() -> None:
        with model.use_drafter(model.drafter):  # every round drafts
            for utterance in utterances:
                list(model.transcribe(utterance.path, beam_size=1, condition_on_previous_text=False)[0])

    transcribe_all()  # warm-up
    totals: collections.Counter = collections.Counter()
    undo: list = []

    def _timed(owner, name: str, key: str) -> None:
        undo.append(time_calls(owner, name, lambda seconds: totals.update({key: seconds})))

    _timed(decoding._Decoding, "accept", "accept (rules, choice, margins, scores)")
    _timed(logit_rules.LogitRules, "_timestamp_rules_block", "of which timestamp rules and choice")
    _timed(logit_rules.BlockChoice, "log_probs", "of which scores of the emitted tokens")
    _timed(logit_rules.BlockChoice, "margins", "of which the guard's margins")
    _timed(runtime, "state_columns", "state columns")
    _timed(decoding.SpeculativeDecoder, "_learn", "counters, draft-length policy and the draft pause")
    model.reset_spec_stats()
    transcribe_all()
    for undone in reversed(undo):
        undone()
    stats = model.spec_stats
    calls = stats.target_calls
    in_loop = {key: 1000 * seconds / calls for key, seconds in totals.items()}
    in_loop["all bookkeeping (the time split's loop part)"] = 1000 * stats.other_seconds / calls

    # Replay: the same blocks, recorded in one more pass, then run one after another (rows
    # copied fresh each time, as the engine hands over new ones).
    decoding._Decoding.accept = recording_accept
    try:
        transcribe_all()
    finally:
        decoding._Decoding.accept = accept
    replay: collections.Counter = collections.Counter()
    for _ in range(3):
        for logits, generated, draft, rules, strategy in blocks:
            rows = logits.copy()
            state = decoding._Decoding(rules=rules, generated=list(generated), strategy=strategy, steps_left=1 << 20)
            seconds, _ = timed(
                lambda rows=rows, state=state, draft=draft: (runtime.state_columns(rows), state.accept(draft, rows))
            )
            replay["accept and state columns"] += seconds
    replayed = {key: 1000 * seconds / (3 * len(blocks)) for key, seconds in replay.items()}

    document = {
        "what": "bookkeeping per target call: in the loop, and the same blocks replayed with warm caches (ms)",
        "speech_set": args.speech_set,
        "utterances": len(utterances),
        "compute_type": "int8",
        "threads": 2,
        "target_calls": calls,
        "blocks": len(blocks),
        "rows_per_block": float(np.mean([b[0].shape[0] for b in blocks])),
        "machine": machine(),
        "in_loop_ms": in_loop,
        "replayed_warm_ms": replayed,
    }
    write_result(args.out, document, echo=())


if __name__ == "__main__":
    main()
