"""Where a drafter's first draft misses on real speech, and whether its shortlist is why.

Every round drafts (no routing, no draft pause, no confidence cut), float32 target, greedy with
timestamps, on the real speech sets of ``ct2-flash bench``. Each round's first draft is
compared with the token the target emitted at that position, found from the next round's
prompt (the last round of each window has no next round and is not scored). Target tokens
are sorted into kinds: a word start (a token that begins with a space), a continuation of a
word, punctuation, a timestamp, end-of-text. For each kind: its share of the first
positions, how often the draft was right, and how often the target's token was not on the
drafter's shortlist (its draft head scores only those tokens, so it could never propose it).

Systems: the shipped drafter as the loop runs it (ONNX Runtime, int8 graphs), its PyTorch
network at float32 with its shortlist, and the same network scoring the whole vocabulary
(the head is the target's tied token embedding, so that needs no training). Writes JSON.

    python bench/studies/drafter_misses.py --out bench/results/drafter_misses/shipped.json
"""

from __future__ import annotations

import argparse
import os
from collections import Counter

from ct2_flash.benchmark.scripts import machine, write_result


def token_kind(token: int, special, tokenizer) -> str:
    if token == special.eot:
        return "end-of-text"
    if token >= special.timestamp_begin:
        return "timestamp"
    if token > special.eot:
        return "other special"
    text = tokenizer.decode([token])
    if not any(c.isalnum() for c in text):
        return "punctuation"
    return "word start" if text.startswith(" ") else "word continuation"


def recorded(drafter, calls: list):
    """``drafter`` with every ``propose`` call recorded as (tokens so far, first draft or None)."""
    propose = drafter.propose

    def wrapper(generated, num_tokens):
        proposal = propose(generated, num_tokens)
        calls.append((tuple(generated), proposal.tokens[0] if proposal.tokens else None))
        return proposal

    drafter.propose = wrapper
    return drafter


def first_positions(calls: list):
    """[(first draft, the target's token there)] per scored round: a round is followed by one
    whose prompt extends its own (the same window)."""
    pairs = []
    for (before, draft), (after, _) in zip(calls, calls[1:]):
        if draft is not None and len(after) > len(before) and after[: len(before)] == before:
            pairs.append((draft, after[len(before)]))
    return pairs


def summary(pairs, shortlist, special, tokenizer, examples: int = 30) -> dict:
    kinds, right, outside = Counter(), Counter(), Counter()
    missed_words = []
    for draft, target in pairs:
        kind = token_kind(target, special, tokenizer)
        kinds[kind] += 1
        right[kind] += draft == target
        outside[kind] += shortlist is not None and target not in shortlist
        if kind == "word start" and draft != target and draft < special.eot and len(missed_words) < examples:
            missed_words.append({"draft": tokenizer.decode([draft]), "target": tokenizer.decode([target])})
    total = max(1, len(pairs))
    return {
        "rounds_scored": len(pairs),
        "first_position_acceptance": sum(right.values()) / total,
        "targets_outside_shortlist": sum(outside.values()) / total,
        "by_kind": {
            kind: {
                "share": kinds[kind] / total,
                "acceptance": right[kind] / kinds[kind],
                "outside_shortlist": outside[kind] / kinds[kind],
            }
            for kind in sorted(kinds, key=lambda k: -kinds[k])
        },
        "missed_word_starts": missed_words,  # the first few, in order: what was drafted, what the target said
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drafter", default=None, help="a converted drafter (default: the shipped one)")
    parser.add_argument("--speech-sets", nargs="+", default=["mfa", "pocketsphinx"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    from ct2_flash import FlashWhisperModel, resolve_model
    from ct2_flash.benchmark.manifest import read_manifest
    from ct2_flash.benchmark.runner import load_audio
    from ct2_flash.benchmark.speech_sets import fetch
    from ct2_flash.drafting.files import SHIPPED_DRAFTERS
    from ct2_flash.drafting.flash_drafter import FlashDrafter, load_checkpoint
    from ct2_flash.drafting.onnx_drafter import ExportManifest, OnnxDrafter

    model_path = resolve_model("tiny.en")
    directory = args.drafter or os.path.join(SHIPPED_DRAFTERS, "tiny.en")
    utterances = [u for name in args.speech_sets for u in read_manifest(fetch(name, ""))]
    audio = load_audio(utterances)
    flash = FlashWhisperModel(
        model_path, stock_engine=False, compute_type="float32", cpu_threads=args.threads, redecodes=False
    )
    special, tokenizer = flash.decoder.runtime.special, flash.hf_tokenizer
    vocabulary = ExportManifest.read(directory).vocabulary
    shortlist = set(int(t) for t in vocabulary) if vocabulary is not None else None
    network = load_checkpoint(directory, model_path)
    systems = {
        "ONNX Runtime, int8 graphs (the loop's round)": lambda: OnnxDrafter(directory, model_path, min_confidence=0.0),
        "PyTorch, float32, its shortlist": lambda: FlashDrafter(network, precision="float32", min_confidence=0.0),
        "PyTorch, float32, whole vocabulary": lambda: FlashDrafter(
            network, precision="float32", min_confidence=0.0, use_shortlist=False
        ),
    }
    document = {
        "what": __doc__.split("\n")[0],
        "drafter": os.path.relpath(directory),
        "speech_sets": args.speech_sets,
        "utterances": len(utterances),
        "shortlist_size": len(shortlist) if shortlist else None,
        "machine": machine(),
        "systems": {},
    }
    for name, build in systems.items():
        calls: list = []
        with flash.use_drafter(recorded(build(), calls), adaptive=False):
            flash.reset_spec_stats()
            for utterance in utterances:
                list(flash.transcribe(audio[utterance.path], beam_size=1, temperature=0.0)[0])
            stats = flash.spec_stats
        result = summary(first_positions(calls), shortlist, special, tokenizer)
        result["tokens_per_target_call"] = stats.tokens_per_call
        result["acceptance_by_position"] = [
            a / max(1, p) for a, p in zip(stats.accepted_by_position, stats.proposed_by_position)
        ]
        document["systems"][name] = result
        print(
            f"{name}: first-position acceptance {result['first_position_acceptance']:.3f}, "
            f"{result['tokens_per_target_call']:.2f} tokens per target call, "
            f"{result['targets_outside_shortlist']:.1%} of first-position targets outside the shortlist"
        )
    write_result(args.out, document)


if __name__ == "__main__":
    main()
