"""What a draft round costs on this CPU by drafter shape: the floor under any training.

The draft round's cost depends on the drafter's shape, not on its weights. For a grid of
shapes (layers, shortlist size, causal or not) this script builds a drafter for tiny.en with
random weights, exports it with the project's own converter (``converters.drafter.export_graphs``,
int8 graphs), loads it as the runtime does (``OnnxDrafter``, one thread, the default audio
window) and times a round where the loop calls it: ``advance`` (one kept state, the usual
case) then ``propose`` (K = 8, or fewer rows where the blocks are causal). The shipped drafter
is timed the same way. Two conditions:

- warm: rounds back to back (the drafter's weights stay in the caches);
- in the loop's conditions: the target (tiny.en, int8, 2 threads) verifies 9 tokens of a real
  window and rolls back before each round, as in the loop, where that pass evicts the
  drafter's weights from the caches (it reads the ~20 MB int8 vocabulary projection).

History 100 positions; the default audio window around the target's position
(``AUDIO_WINDOW``). Pause background jobs first: the two cores are shared. Needs the
``[train]`` extra (the converter exports with PyTorch).

    python bench/studies/round_floor.py --out bench/results/round_floor/int8.json
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np

from ct2_flash.benchmark.scripts import lowest_median_ms, machine, write_result

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HISTORY = 100
# (layers, shortlist size, causal blocks); the shipped drafter is 2 layers, 8,192, not causal.
SHAPES = [(2, 8192, False), (2, 4096, True), (1, 8192, True), (1, 4096, True), (1, 2048, True)]
ROWS = (8, 4, 2)  # drafts asked for: a causal drafter computes as many rows, others all 8
TEXT_TOKENS = 50256  # tiny.en's ids below <|endoftext|>, from which a random shortlist is drawn


def _random_drafter(model_path: str, directory: str, layers: int, shortlist: int, causal: bool) -> None:
    """Write a converted drafter of this shape with random weights into ``directory``."""
    import torch

    from ct2_flash.converters.drafter import _FILES, OPSET, export_graphs
    from ct2_flash.drafting.files import DrafterConfig, target_identity
    from ct2_flash.drafting.flash_drafter import save_checkpoint
    from ct2_flash.drafting.flash_model import FlashDrafterModel
    from ct2_flash.drafting.onnx_drafter import ExportManifest
    from ct2_flash.engine.model_files import CT2ModelFile

    config = DrafterConfig(
        target=target_identity(model_path, "tiny.en"), num_layers=layers, shortlist_size=shortlist, causal_blocks=causal
    )
    torch.manual_seed(0)
    model = FlashDrafterModel(config)
    model.init_from_target(CT2ModelFile(model_path))
    with torch.no_grad():
        model.shortlist.copy_(torch.sort(torch.randperm(TEXT_TOKENS)[:shortlist]).values)
    save_checkpoint(model, directory)
    export_graphs(model, directory)
    ExportManifest(opset=OPSET, graphs=_FILES, verification={}, vocabulary=model.shortlist.tolist()).write(directory)


def _time_round(drafter, window, states: np.ndarray, num_tokens: int, repeats: int, between=None) -> float:
    """ms of ``advance`` (one state) + ``propose(num_tokens)``, the history held at ``HISTORY``
    positions (every round hands over the same position, so its state replaces the last
    round's): the lowest of four medians of ``repeats / 4`` rounds, since other work on the
    two cores comes in bursts."""
    drafter.begin(window)
    drafter.observe_position(400)
    start = len(window.prompt)
    drafter.advance(states[: HISTORY - 1], start + HISTORY - 1)
    generated = list(window.prompt) + [300] * HISTORY

    return lowest_median_ms(
        lambda: (
            drafter.advance(states[HISTORY - 1 : HISTORY], start + HISTORY),
            drafter.propose(generated, num_tokens),
        ),
        repeats,
        before=between,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=200, help="rounds timed per measurement")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "round_floor", "int8.json"))
    args = parser.parse_args()

    from faster_whisper import decode_audio

    from ct2_flash import FlashWhisperModel
    from ct2_flash.drafting.audio_window import AUDIO_WINDOW
    from ct2_flash.drafting.base import DraftWindow
    from ct2_flash.drafting.files import SHIPPED_DRAFTERS
    from ct2_flash.drafting.onnx_drafter import OnnxDrafter
    from ct2_flash.engine.models import resolve_model
    from ct2_flash.loop.options import DecodingOptions

    model_path = resolve_model("tiny.en")
    # One model on 2 threads for the loop too (no one-thread decoder copy): the verification
    # that runs before each round is the 2-thread pass.
    flash = FlashWhisperModel(
        model_path, stock_engine=False, compute_type="int8", cpu_threads=2, decoder_threads=None, redecodes=False
    )
    runtime = flash.decoder.runtime
    encoder_output = flash.encode_window(decode_audio(os.path.join(ROOT, "tests", "data", "clip12_awb.ogg")))
    prompt = [runtime.special.sot, runtime.special.no_timestamps]
    tokens = flash.reference_model.generate(encoder_output, [prompt], beam_size=1)[0].sequences_ids[0][:9]
    sequence = runtime.start(encoder_output, prompt).sequence
    length = sequence.length

    def verification() -> None:
        sequence.verify(tokens)
        sequence.rollback(length)

    # The target's own costs first, before any drafter session exists.
    plain_step_ms = lowest_median_ms(lambda: (sequence.verify(tokens[:1]), sequence.rollback(length)), args.repeats)
    verify_9_ms = lowest_median_ms(verification, args.repeats)
    rng = np.random.default_rng(0)
    window = DraftWindow(
        encoder_output=np.asarray(encoder_output)[0],
        prompt=tuple(prompt),
        options=DecodingOptions(),
        eot=runtime.special.eot,
        audio_frames=None,
    )
    states = rng.standard_normal((HISTORY, 384), dtype=np.float32)
    results = []
    with tempfile.TemporaryDirectory() as work:
        drafters = [
            ("shipped (2 layers, 8,192, not causal)", os.path.join(SHIPPED_DRAFTERS, "tiny.en"), 2, 8192, False)
        ]
        for layers, shortlist, causal in SHAPES:
            directory = os.path.join(work, f"{layers}_{shortlist}_{int(causal)}")
            _random_drafter(model_path, directory, layers, shortlist, causal)
            drafters.append(
                (
                    f"random weights ({layers} layer{'s' * (layers > 1)}, {shortlist:,}, "
                    f"{'causal' if causal else 'not causal'})",
                    directory,
                    layers,
                    shortlist,
                    causal,
                )
            )
        for name, directory, layers, shortlist, causal in drafters:
            drafter = OnnxDrafter(directory, model_path)
            for num_tokens in ROWS if causal else ROWS[:1]:
                row = {
                    "drafter": name,
                    "layers": layers,
                    "shortlist": shortlist,
                    "causal_blocks": causal,
                    "drafts": num_tokens,
                    "rows": 1 + (num_tokens if causal else 8),
                    "warm_ms": _time_round(drafter, window, states, num_tokens, args.repeats),
                    "in_loop_ms": _time_round(drafter, window, states, num_tokens, args.repeats, verification),
                }
                results.append(row)
                print(
                    f"{name}, {num_tokens} drafts (plain step {plain_step_ms:.2f} ms): warm {row['warm_ms']:.2f} ms, "
                    f"after a verification {row['in_loop_ms']:.2f} ms"
                )
    document = {
        "what": "draft round (advance one state + propose) by drafter shape, ONNX Runtime int8, one thread",
        "plain_step_ms": plain_step_ms,
        "verify_9_ms": verify_9_ms,
        "history_positions": HISTORY,
        "audio_window": list(AUDIO_WINDOW),
        "machine": machine(),
        "results": results,
    }
    write_result(args.out, document)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
