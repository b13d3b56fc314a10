"""Re-decodes of a growing buffer, as streaming clients make them: ct2-flash against faster-whisper.

A streaming client (whisper_streaming, whisperlivekit, ...) transcribes its whole buffer again
every second as audio arrives. This replays that on long real speech: each stream (the 94 s
test clip; real clips of a speech set joined with short gaps) is cut into pieces of up to
``--cap`` seconds, and each piece is transcribed as buffers ending at 2, 3, ... s by one model
instance (greedy, ``beam_size=1``, timestamps on: the bar's protocol), by three systems:

- ``same``: faster-whisper on the engine ct2-flash runs its loop on (the patched runtime);
- ``flash``: ``FlashWhisperModel`` as users get it (the stock worker, the routers, the
  previous hypothesis offered to re-decodes);
- ``stock``: faster-whisper on stock ctranslate2, in a worker process (what users run today);
- ``tuned_stock``: the same in a process of its own with the allocator a user sets without
  code (tcmalloc preloaded where installed, else glibc's variables: ``stock/allocator.py``).

The systems take turns per piece (in a rotating order, every repeat), a piece's buffers in a
row, as a client makes them; ``flash`` forgets its remembered windows before each piece so a
repeat is a first stream again. Per buffer the median over repeats is used; ratios are
sum over buffers of the baseline's time over the candidate's, with a paired bootstrap
interval over buffers. Writes JSON and a PNG (time per buffer against its length).

    python bench/redecodes.py --compute-types int8 float32 --speech-set mfa --repeats 2 \
        --out bench/results/redecodes/redecodes.json
"""

from __future__ import annotations

import argparse
import os
import statistics
from typing import Dict, List, Tuple

import numpy as np

from ct2_flash.benchmark.scripts import TEST_CLIPS, save_figure, write_result
from ct2_flash.benchmark.stock import STOCK_SYSTEMS
from ct2_flash.loop.stats import OFFERED_ENDS

RATE = 16000
SYSTEMS = ("same", "flash", *STOCK_SYSTEMS)


def streams(speech_set: str, stream_seconds: float, gap: float) -> Dict[str, np.ndarray]:
    """Name -> waveform: the 94 s test clip, and a speech set's clips joined in order (with
    ``gap`` seconds of silence between them) into streams of about ``stream_seconds``."""
    from faster_whisper import decode_audio

    found = {"long_multi_voice": decode_audio(os.path.join(TEST_CLIPS, "long_multi_voice.ogg"))}
    if speech_set:
        from ct2_flash.benchmark.manifest import read_manifest
        from ct2_flash.benchmark.speech_sets import fetch

        silence = np.zeros(int(gap * RATE), np.float32)
        joined: List[np.ndarray] = []
        for utterance in read_manifest(fetch(speech_set)):
            joined += [decode_audio(utterance.path), silence]
            if sum(part.size for part in joined) >= stream_seconds * RATE:
                found[f"{speech_set}-{len(found)}"] = np.concatenate(joined)
                joined = []
        if joined and sum(part.size for part in joined) >= 0.5 * stream_seconds * RATE:
            found[f"{speech_set}-{len(found)}"] = np.concatenate(joined)
    return found


def pieces(stream: np.ndarray, cap: float) -> List[np.ndarray]:
    """Consecutive pieces of up to ``cap`` seconds (the last one at least 3 s)."""
    size = int(cap * RATE)
    return [stream[start : start + size] for start in range(0, stream.size, size) if stream.size - start >= 3 * RATE]


def buffer_ends(piece: np.ndarray, first: float, step: float) -> List[int]:
    """Sample counts of the growing buffers: first, first + step, ... and the whole piece."""
    ends = list(range(int(first * RATE), piece.size, int(step * RATE)))
    return ends + [piece.size]


def run_compute_type(compute_type: str, pieces_by_name: Dict[str, np.ndarray], args) -> dict:
    from faster_whisper import WhisperModel
    from tqdm import tqdm

    from ct2_flash import FlashWhisperModel, resolve_model
    from ct2_flash.benchmark.measure import measure
    from ct2_flash.benchmark.stock import allocators_of, local_baseline, stock_systems

    path = resolve_model(args.model)
    same = WhisperModel(path, compute_type=compute_type, cpu_threads=args.threads)
    flash = FlashWhisperModel(path, compute_type=compute_type, cpu_threads=args.threads)
    python, stock_path = local_baseline()
    stocks = stock_systems(python, path, compute_type, args.threads, stock_path)
    options = dict(beam_size=1)
    names = list(pieces_by_name)
    warm = pieces_by_name[names[0]][: 5 * RATE]
    for model in (same, flash):
        measure(model, warm, **options)
    for stock in stocks.values():
        stock.measure("warm", warm, 0, **options)
    flash.model.recent.clear()
    # (piece, end) -> system -> [Measurement per repeat]
    runs: Dict[Tuple[str, int], Dict[str, list]] = {}
    loop_stats = []
    total = args.repeats * len(SYSTEMS) * sum(len(buffer_ends(pieces_by_name[n], args.first, args.step)) for n in names)
    with tqdm(total=total, desc=compute_type) as progress:
        for repeat in range(args.repeats):
            for index, name in enumerate(names):
                piece = pieces_by_name[name]
                ends = buffer_ends(piece, args.first, args.step)
                shift = (index + repeat) % len(SYSTEMS)
                for system in SYSTEMS[shift:] + SYSTEMS[:shift]:
                    if system == "flash":
                        flash.model.recent.clear()  # a repeat is a first stream again
                        flash.reset_spec_stats()
                    for end in ends:
                        buffer = piece[:end]
                        if system in stocks:
                            result = stocks[system].measure(f"{name}:{end}", buffer, 0, **options)
                        else:
                            result = measure(same if system == "same" else flash, buffer, **options)
                        runs.setdefault((name, end), {}).setdefault(system, []).append(result)
                        progress.update()
                    if system == "flash":
                        stats = flash.spec_stats
                        loop_stats.append(
                            {
                                "piece": name,
                                "repeat": repeat,
                                "buffers": len(ends),
                                "redecodes": stats.redecodes,
                                "loop_rows": stats.rows_in_loop,
                                "generate_rows": stats.rows_in_generate,
                                "target_calls": stats.target_calls,
                                "emitted": stats.emitted,
                                "offered_rounds": stats.offered_rounds,
                                "offered": stats.offered,
                                "offered_accepted": stats.offered_accepted,
                                "offered_ends": dict(stats.offered_ends),
                                "draft_rounds": stats.draft_rounds,
                                "proposed": stats.proposed,
                                "accepted": stats.accepted,
                            }
                        )
    allocators = allocators_of(stocks)
    for stock in stocks.values():
        stock.close()
    return {**summarise(compute_type, runs, loop_stats, flash), "stock_allocators": allocators}


def summarise(compute_type: str, runs, loop_stats: List[dict], flash) -> dict:
    from ct2_flash.benchmark.analysis import paired_bootstrap

    rows = []
    for (name, end), by_system in runs.items():
        row = {"piece": name, "seconds": end / RATE}
        for system, results in by_system.items():
            row[system] = {
                part: statistics.median(getattr(r, f"{part}_seconds") for r in results)
                for part in ("whole", "encode", "decode")
            }
        tokens = {system: results[0].tokens for system, results in by_system.items()}
        # A buffer whose greedy text failed faster-whisper's thresholds was sampled: each system
        # draws its own, so identity is counted over the greedy buffers only.
        row["greedy"] = all(t == 0 for results in by_system.values() for r in results for t in r.temperatures)
        row["flash_equals_same"] = tokens["flash"] == tokens["same"]
        row["flash_equals_stock"] = tokens["flash"] == tokens["stock"]
        row["flash_equals_tuned_stock"] = tokens["flash"] == tokens["tuned_stock"]
        row["same_equals_stock"] = tokens["same"] == tokens["stock"]
        row["repeats_agree"] = all(r.tokens == results[0].tokens for results in by_system.values() for r in results)
        rows.append(row)

    def ratio(baseline: str, part: str) -> dict:
        return paired_bootstrap([row[baseline][part] for row in rows], [row["flash"][part] for row in rows])

    total = lambda key: sum(entry[key] for entry in loop_stats)  # noqa: E731
    return {
        "compute_type": compute_type,
        "buffers": len(rows),
        "audio_seconds_transcribed": sum(row["seconds"] for row in rows),
        "seconds": {
            system: {part: sum(row[system][part] for row in rows) for part in ("whole", "encode", "decode")}
            for system in SYSTEMS
        },
        "speedup": {
            f"vs_{baseline}": {part: ratio(baseline, part) for part in ("whole", "decode")}
            for baseline in ("same", *STOCK_SYSTEMS)
        },
        "greedy_buffers": sum(row["greedy"] for row in rows),
        "identical_of_greedy": {
            key: sum(row[key] for row in rows if row["greedy"])
            for key in (
                "flash_equals_same",
                "flash_equals_stock",
                "flash_equals_tuned_stock",
                "same_equals_stock",
                "repeats_agree",
            )
        },
        "loop": {
            "redecodes": total("redecodes"),
            "calls": total("buffers"),
            "rows_in_loop": total("loop_rows"),
            "rows_in_generate": total("generate_rows"),
            "tokens_per_target_call": total("emitted") / max(total("target_calls"), 1),
            "offered_acceptance": total("offered_accepted") / max(total("offered"), 1),
            "offered_rounds": total("offered_rounds"),
            # What ended the offered rounds, and rounds the fallback drafter proposed in.
            "offered_ends": {
                end: sum(entry["offered_ends"].get(end, 0) for entry in loop_stats) for end in OFFERED_ENDS
            },
            "draft_rounds": total("draft_rounds"),
            "drafter_acceptance": (total("accepted") - total("offered_accepted"))
            / max(total("proposed") - total("offered"), 1),
            "keeps_freed_memory": flash.model.engines.stock.keeps_freed_memory if flash.model.engines.stock else None,
            "worker_allocator": flash.model.engines.stock.allocator if flash.model.engines.stock else None,
        },
        "per_piece_loop": loop_stats,
        "rows": rows,
    }


def plot(document: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = document["settings"]
    figure, axes = plt.subplots(1, len(settings), figsize=(5.5 * len(settings), 4), squeeze=False)
    for axis, setting in zip(axes[0], settings):
        for system in SYSTEMS:
            by_length: Dict[int, list] = {}
            for row in setting["rows"]:
                by_length.setdefault(int(round(row["seconds"])), []).append(row[system]["whole"])
            lengths = sorted(by_length)
            axis.plot(lengths, [statistics.median(by_length[n]) for n in lengths], marker=".", label=system)
        axis.set(
            xlabel="buffer (s)",
            ylabel="whole path per buffer (s, median)",
            title=f"{setting['compute_type']}: flash {setting['speedup']['vs_same']['whole']['speedup']:.2f}x same, "
            f"{setting['speedup']['vs_stock']['whole']['speedup']:.2f}x stock, "
            f"{setting['speedup']['vs_tuned_stock']['whole']['speedup']:.2f}x tuned",
        )
        axis.axhline(1.0, color="grey", linestyle="--", linewidth=0.8)
        axis.legend()
    figure.suptitle(f"re-decodes of growing buffers, {document['model']}, {document['machine'].get('cpu', '')}")
    save_figure(figure, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--compute-types", nargs="+", default=["int8", "float32"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--speech-set", default="mfa", help="a speech set to join into streams ('' for the test clip only)"
    )
    parser.add_argument("--stream-seconds", type=float, default=120.0)
    parser.add_argument("--max-streams", type=int, default=1, help="streams of the speech set used")
    parser.add_argument("--gap", type=float, default=0.3)
    parser.add_argument("--cap", type=float, default=25.0, help="the longest buffer (s)")
    parser.add_argument("--first", type=float, default=2.0)
    parser.add_argument("--step", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.repeats < 1 or args.cap < 3 or args.step <= 0:
        parser.error("need --repeats >= 1, --cap >= 3 and --step > 0")

    found = streams(args.speech_set, args.stream_seconds, args.gap)
    chosen = ["long_multi_voice"] + [name for name in found if name != "long_multi_voice"][: args.max_streams]
    pieces_by_name = {
        f"{name}#{index}": piece for name in chosen for index, piece in enumerate(pieces(found[name], args.cap))
    }
    document = {
        "what": "re-decodes of growing buffers (greedy, timestamps): faster-whisper on the same engine, ct2-flash, "
        "faster-whisper on stock ctranslate2, plain and with the tuned allocator",
        "model": args.model,
        "threads": args.threads,
        "cap_seconds": args.cap,
        "first_seconds": args.first,
        "step_seconds": args.step,
        "repeats": args.repeats,
        "streams": {name: found[name].size / RATE for name in chosen},
        "settings": [run_compute_type(compute_type, pieces_by_name, args) for compute_type in args.compute_types],
    }
    write_result(args.out, document)
    plot(document, args.out.rsplit(".", 1)[0] + ".png")
    for setting in document["settings"]:
        speed, loop = setting["speedup"], setting["loop"]
        print(
            f"{setting['compute_type']}: whole {speed['vs_same']['whole']['speedup']:.2f}x same / "
            f"{speed['vs_stock']['whole']['speedup']:.2f}x stock / {speed['vs_tuned_stock']['whole']['speedup']:.2f}x tuned "
            f"stock; decode {speed['vs_same']['decode']['speedup']:.2f}x / {speed['vs_stock']['decode']['speedup']:.2f}x / "
            f"{speed['vs_tuned_stock']['decode']['speedup']:.2f}x; {loop['tokens_per_target_call']:.2f} tokens per target "
            f"call; identical to stock {setting['identical_of_greedy']['flash_equals_stock']}/{setting['greedy_buffers']} "
            f"greedy buffers ({setting['buffers']} in all)"
        )


if __name__ == "__main__":
    main()
