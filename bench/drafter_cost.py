"""What one draft round costs next to one verification, on the same machine and threads.

Measures, on a real window of the test speech: the drafter's ``propose`` (K tokens) and
``advance`` (9 new history states), and the target's ``verify`` of 9 tokens and a single
step, each as a median over many repetitions after warm-up. Writes JSON.

    python bench/drafter_cost.py --drafter DIR [--compute-type int8] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def median_ms(function, repeats: int, warmup: int = 3) -> float:
    """Median wall time of ``function()`` in ms over ``repeats`` calls after ``warmup`` calls."""
    for _ in range(warmup):
        function()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def main() -> None:
    import torch
    from faster_whisper import decode_audio

    from ct2_flash import FlashWhisperModel
    from ct2_flash.drafting.base import DraftWindow, DecodingOptions
    from ct2_flash.drafting.flash_drafter import FlashDrafter, load_checkpoint

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drafter", required=True, help="drafter checkpoint directory")
    parser.add_argument("--compute-type", default="int8")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "drafter_cost.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    flash = FlashWhisperModel("tiny.en", compute_type=args.compute_type, cpu_threads=args.threads)
    runtime = flash.decoder.runtime
    drafter = FlashDrafter(load_checkpoint(args.drafter, runtime.model_path))
    audio = decode_audio(os.path.join(ROOT, "tests", "data", "clip12_awb.ogg"))
    encoder_output = flash.encode_window(audio)
    prompt = [50257]
    reference = flash.reference_model.generate(encoder_output, [prompt], beam_size=1)[0].sequences_ids[0]
    tokens = list(reference[:60])
    prefill = runtime.start(encoder_output, prompt)
    states = runtime.decoder_states(np.concatenate([prefill.next_logits[None], prefill.sequence.verify(tokens)]))
    window = DraftWindow(np.asarray(encoder_output)[0], tuple(prompt), DecodingOptions(), runtime.special.eot)
    length = prefill.sequence.length  # prompt + 60 tokens

    def begin():
        drafter.begin(window)
        drafter.advance(states[:-9], length - 9)

    def advance():
        drafter.advance(states[-9:], length)

    begin()
    advance()
    results = {
        "begin_ms (encoder keys/values, once per window)": median_ms(begin, max(5, args.repeats // 5)),
        "advance_ms (9 states)": median_ms(advance, args.repeats),
        "propose_ms (K tokens)": median_ms(lambda: drafter.propose(tokens, drafter.num_draft_tokens), args.repeats),
    }

    def verify(count):
        def run():
            prefill.sequence.verify(tokens[:count])
            prefill.sequence.rollback(length)
        return run

    prefill.sequence.rollback(length - 20)
    length = prefill.sequence.length
    results["verify_9_ms"] = median_ms(verify(9), args.repeats)
    results["verify_1_ms"] = median_ms(verify(1), args.repeats)
    results["round_over_verify"] = (results["propose_ms (K tokens)"] + results["advance_ms (9 states)"]) / results["verify_9_ms"]
    document = {"compute_type": args.compute_type, "threads": args.threads, "drafter": args.drafter, **results}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as stream:
        json.dump(document, stream, indent=2)
    print(json.dumps(document, indent=2))


if __name__ == "__main__":
    main()
