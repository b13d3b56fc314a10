"""What a draft round costs inside the loop: PyTorch eager against the exported graphs.

Each drafter runs the speculative loop on the same utterances (drafting every round, one
model, K = 8, no guard), with the round's parts timed where the loop calls them: the proposal,
the history update and the recovery of the target's states from its logits. A plain step
(a drafter that proposes nothing) is timed in the same run, so every cost is also given as a
fraction of a step. Writes JSON.

    python bench/studies/draft_round.py --speech-set mfa --limit 16 --out bench/results/draft_round/int8.json
    python bench/studies/draft_round.py --audio LONG.wav ... --out bench/results/draft_round/int8_long.json
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
from collections import defaultdict

from ct2_flash.benchmark.scripts import machine, save_figure, time_calls, write_result


def _all_frames(drafter):
    """``drafter`` reading all 1,500 encoder frames, padding included (as before the audio cut)."""
    begin = drafter.begin
    drafter.begin = lambda window: begin(dataclasses.replace(window, audio_frames=None))
    return drafter


def _drafters(model_path: str, directory: str):
    from ct2_flash.drafting.flash_drafter import FlashDrafter, load_checkpoint
    from ct2_flash.drafting.onnx_drafter import OnnxDrafter

    return {
        "pytorch eager, int8 weights, all frames": lambda: _all_frames(
            FlashDrafter(load_checkpoint(directory, model_path), precision="int8")
        ),
        "onnx runtime, float32 graphs, all frames": lambda: _all_frames(
            OnnxDrafter(directory, model_path, precision="float32", audio_window=None)
        ),
        "onnx runtime, int8 graphs, all frames": lambda: _all_frames(
            OnnxDrafter(directory, model_path, precision="int8", audio_window=None)
        ),
        "onnx runtime, int8 graphs, audio frames": lambda: OnnxDrafter(
            directory, model_path, precision="int8", audio_window=None
        ),
        "onnx runtime, int8 graphs, window at the position (default)": lambda: OnnxDrafter(
            directory, model_path, precision="int8"
        ),
    }


def _plot_calibration(raw, path: str, title: str) -> None:
    """The calibration of one run (``SpecStats.calibration``), drawn as the runner draws its own."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ct2_flash.benchmark.plots import draw_calibration
    from ct2_flash.benchmark.runner import calibration_cells

    figure, axis = plt.subplots(figsize=(5.5, 4.5))
    draw_calibration(axis, calibration_cells([{"calibration": raw}]), f"draft calibration: {title}")
    save_figure(figure, path)


def main() -> None:
    from ct2_flash import Drafter, FlashWhisperModel, Proposal, resolve_model
    from ct2_flash.benchmark.manifest import read_manifest
    from ct2_flash.benchmark.runner import load_audio
    from ct2_flash.benchmark.speech_sets import fetch
    from ct2_flash.drafting.files import SHIPPED_DRAFTERS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--speech-set", default="mfa", choices=["mfa", "pocketsphinx"])
    parser.add_argument(
        "--audio",
        nargs="+",
        default=None,
        help="audio files to use instead of the speech set (long recordings: full 30 s windows)",
    )
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--compute-type", default="int8")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--drafter", default=os.path.join(SHIPPED_DRAFTERS, "tiny.en"))
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    class NoDrafts(Drafter):
        def begin(self, window) -> None:
            pass

        def propose(self, generated, num_tokens) -> Proposal:
            return Proposal(tokens=())

    model_path = resolve_model("tiny.en")
    if args.audio:
        from faster_whisper.audio import decode_audio

        utterances = [argparse.Namespace(path=path) for path in args.audio]
        audio = {path: decode_audio(path) for path in args.audio}
    else:
        utterances = read_manifest(fetch(args.speech_set, ""))[: args.limit]
        audio = load_audio(utterances)
    flash = FlashWhisperModel(
        model_path,
        stock_engine=False,
        compute_type=args.compute_type,
        cpu_threads=args.threads,
        decoder_threads=None,
        adaptive=False,
        guard_margin=0.0,
        near_exact=True,
        redecodes=False,
    )
    decoder = flash.decoder
    makers = {"plain steps": NoDrafts, **_drafters(model_path, args.drafter)}
    results = {}
    for name, make in makers.items():
        drafter = make()
        times = defaultdict(list)
        if name != "plain steps":
            for method in ("propose", "advance", "begin"):
                time_calls(drafter, method, times[method].append)
        time_calls(decoder.runtime, "states_from_columns", times["recovery"].append)
        with decoder.use_drafter(drafter):
            list(flash.transcribe(audio[utterances[0].path], beam_size=1)[0])  # warm-up
            for values in times.values():
                values.clear()
            flash.reset_spec_stats()
            for utterance in utterances:
                list(flash.transcribe(audio[utterance.path], beam_size=1)[0])
        del decoder.runtime.states_from_columns  # drop the instance patch
        stats = flash.spec_stats
        results[name] = {
            "rounds": stats.draft_rounds,
            "target_calls": stats.target_calls,
            "tokens_per_target_call": stats.tokens_per_call,
            "acceptance_rate": stats.acceptance_rate,
            "verify_ms_per_call": 1e3 * stats.verify_seconds / stats.target_calls,
            "other_ms_per_call": 1e3 * stats.other_seconds / stats.target_calls,
            **{f"{part}_ms": 1e3 * statistics.fmean(values) for part, values in times.items() if values},
            # judged / accepted draft positions by confidence bin, per position
            "calibration": [[list(cell) for cell in position] for position in stats.calibration],
        }
    step = results["plain steps"]["verify_ms_per_call"]
    for name, result in results.items():
        if name != "plain steps":
            round_ms = result["propose_ms"] + result["advance_ms"] + result.get("recovery_ms", 0.0)
            result["draft_round_ms"] = round_ms
            result["draft_round_in_steps"] = round_ms / step
    document = {
        "what": "in-loop draft round cost (propose + history update + state recovery) per drafter",
        "speech_set": args.speech_set if not args.audio else [os.path.basename(p) for p in args.audio],
        "utterances": len(utterances),
        "compute_type": args.compute_type,
        "threads": args.threads,
        "machine": machine(),
        "plain_step_ms": step,
        "results": results,
    }
    write_result(args.out, document)
    _plot_calibration(
        results["onnx runtime, int8 graphs, window at the position (default)"]["calibration"],
        args.out.rsplit(".", 1)[0] + "_calibration.png",
        f"{'long recordings' if args.audio else args.speech_set}, {args.compute_type}, int8 graphs",
    )
    for name, result in results.items():
        print(name, {k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()})


if __name__ == "__main__":
    main()
