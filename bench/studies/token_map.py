"""Would a token map pay as a drafter in a known domain? An offline replay, no training.

Token Map Drafting: from the target's own transcripts of a user's audio, a map from the last
one to three tokens to the token that most often came next; a round drafts by following it
from what the decode has said, K tokens or until no context matches. This script builds that
map from the target's greedy outputs on a speech set's training half (the split ``ct2-flash
adapt --holdout H`` makes: ``user_audio.split_by_file``) and replays its rounds on the held-out
half against the same target's outputs, as the loop would run them: each window costs its
prefill call, which emits one token, and each round emits the drafts the target agrees with
plus the target's own next token. Replays cost nothing but the target's transcripts, so this
says what such a drafter would reach in tokens per target call, beside an always-right drafter
(the ceiling any drafter works under) and the break-even of a round (docs/measurements.md).

    python bench/studies/token_map.py --speech-set asterisk --holdout 0.2 --out bench/results/adapt/token_map.json
"""

from __future__ import annotations

import argparse
import collections
import os
from typing import Dict, List, Sequence, Tuple

from ct2_flash.benchmark.scripts import machine, write_result

START = -1  # stands before a window's first token: the map's context at a window's start
MAX_CONTEXT = 3


def transcripts(paths: Sequence[str], compute_type: str, threads: int) -> Dict[str, List[List[int]]]:
    """Path -> the target's greedy output of each of its ``generate()`` calls (timestamps on,
    end of text appended), as faster-whisper's ``transcribe`` asks for them."""
    from ct2_flash import FlashWhisperModel

    model = FlashWhisperModel("tiny.en", compute_type=compute_type, cpu_threads=threads, redecodes=False)
    eot = model.model.decoder.runtime.special.eot
    calls: List[List[int]] = []
    generate = model.model.generate

    def recording(features, prompts, **options):
        results = generate(features, prompts, **options)
        calls.extend(list(result.sequences_ids[0]) + [eot] for result in results)
        return results

    model.model.generate = recording
    outputs = {}
    for path in paths:
        calls.clear()
        list(model.transcribe(path, beam_size=1, temperature=0)[0])
        outputs[path] = [list(call) for call in calls]
    return outputs


def build_map(sequences: Sequence[Sequence[int]]) -> Dict[Tuple[int, ...], int]:
    """Context (the last 1-3 tokens, ``START`` before a window's first) -> the token that most
    often followed it in ``sequences`` (ties: the one seen first)."""
    counts: Dict[Tuple[int, ...], collections.Counter] = collections.defaultdict(collections.Counter)
    for sequence in sequences:
        history = [START] + list(sequence)
        for i in range(1, len(history)):
            for n in range(1, MAX_CONTEXT + 1):
                if i - n >= 0:
                    counts[tuple(history[i - n : i])][history[i]] += 1
    return {context: counter.most_common(1)[0][0] for context, counter in counts.items()}


def draft(token_map: Dict[Tuple[int, ...], int], history: List[int], k: int) -> List[int]:
    """Up to ``k`` tokens following the longest context of ``history`` the map knows, each
    drafted token becoming context for the next."""
    drafted: List[int] = []
    context = list(history)
    while len(drafted) < k:
        for n in range(MAX_CONTEXT, 0, -1):
            following = token_map.get(tuple(context[-n:])) if len(context) >= n else None
            if following is not None:
                break
        else:
            break
        drafted.append(following)
        context.append(following)
    return drafted


def replay(sequence: Sequence[int], propose, k: int) -> Tuple[int, int, int]:
    """(target calls, tokens emitted, drafted tokens accepted) of one window decoded by the
    loop with ``propose(history, k)`` drafting every round after the prefill."""
    calls, emitted, accepted_total = 1, 1, 0  # the prefill call emits the first token
    while emitted < len(sequence):
        history = [START] + list(sequence[:emitted])
        drafted = propose(history, k)
        accepted = 0
        while accepted < len(drafted) and emitted + accepted < len(sequence):
            if drafted[accepted] != sequence[emitted + accepted]:
                break
            accepted += 1
        calls += 1
        accepted_total += accepted
        emitted += min(accepted + 1, len(sequence) - emitted)
    return calls, emitted, accepted_total


def measure(sequences: Sequence[Sequence[int]], proposer, k: int) -> dict:
    """Tokens per target call over ``sequences``, each replayed with ``proposer(sequence)``'s
    drafts (a drafter may know the window it drafts for: the always-right one does)."""
    calls = tokens = accepted = 0
    for sequence in sequences:
        c, t, a = replay(sequence, proposer(sequence), k)
        calls, tokens, accepted = calls + c, tokens + t, accepted + a
    return {"target_calls": calls, "tokens": tokens, "accepted": accepted, "tokens_per_target_call": tokens / calls}


def always_right(sequence: Sequence[int]):
    """Drafts the window's own next tokens (``history`` holds ``START`` and what was said)."""
    return lambda history, k: list(sequence[len(history) - 1 : len(history) - 1 + k])


def following(token_map: Dict[Tuple[int, ...], int]):
    return lambda sequence: lambda history, k: draft(token_map, history, k)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--speech-set", default="asterisk")
    parser.add_argument("--holdout", type=float, default=0.2)
    parser.add_argument("--compute-type", default="float32")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--out", default=os.path.join("bench", "results", "adapt", "token_map.json"))
    args = parser.parse_args()

    from ct2_flash.benchmark.manifest import read_manifest
    from ct2_flash.benchmark.speech_sets import fetch
    from ct2_flash.train.user_audio import split_by_file

    paths = [u.path for u in read_manifest(fetch(args.speech_set, ""))]
    split = split_by_file(paths, args.holdout)
    outputs = transcripts(paths, args.compute_type, args.threads)
    train = [seq for path in paths if split[path] != "validation" for seq in outputs[path]]
    held = [seq for path in paths if split[path] == "validation" for seq in outputs[path]]
    token_map = build_map(train)
    results = {
        "token_map": measure(held, following(token_map), args.k),
        "always_right": measure(held, always_right, args.k),
        # A map of the held-out half itself: what a map that knew the phrases to come would reach.
        "token_map_of_held_out": measure(held, following(build_map(held)), args.k),
    }
    write_result(
        args.out,
        {
            "command": "python bench/studies/token_map.py "
            + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()),
            "machine": machine(),
            "speech_set": args.speech_set,
            "holdout": args.holdout,
            "files": {
                "train": sum(split[p] != "validation" for p in paths),
                "held_out": sum(split[p] == "validation" for p in paths),
            },
            "windows": {"train": len(train), "held_out": len(held)},
            "map_contexts": len(token_map),
            "k": args.k,
            "results": results,
        },
    )
    for name, result in results.items():
        print(
            f"{name}: {result['tokens_per_target_call']:.2f} tokens per target call ({result['tokens']} tokens, {result['target_calls']} calls)"
        )


if __name__ == "__main__":
    main()
