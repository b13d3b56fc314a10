"""Soak: many transcriptions in one process; does memory, or do file handles or threads, grow?

Mixed lengths (the committed clips, 2-94 s, and pieces of them cut at random down to 1 s),
both compute types, with the shipped drafter and with the prompt-lookup one, greedy and
sampled: one model per (compute type, drafter) pair, each call on one of them in turn.
Resident memory (``/proc/self/statm``), open file descriptors and threads are recorded after
every call; growth is measured from the end of the warm-up (the first 10% of the calls) to
the end, and over the second half. Before call 0 every model transcribes the longest clip,
greedy and sampled, so that the warm-up is not the first time a model meets its largest
buffers (the first run, without it, grew in steps at exactly those calls until call ~400 and
then stayed flat). Writes JSON and a PNG.

    python bench/soak.py --calls 1000 --out bench/results/soak/soak.json
"""

from __future__ import annotations

import argparse
import glob
import os
import threading
import time

from ct2_flash.benchmark.scripts import save_figure, write_result


def resident_mb() -> float:
    with open("/proc/self/statm", encoding="ascii") as stream:
        return int(stream.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def open_files() -> int:
    return len(os.listdir("/proc/self/fd"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from faster_whisper import decode_audio
    from tqdm import tqdm

    from ct2_flash import FlashWhisperModel, PromptLookupDrafter

    data = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data")
    clips = [decode_audio(path) for path in sorted(glob.glob(os.path.join(data, "*.ogg")))]
    models = {
        (compute, drafter): FlashWhisperModel(
            "tiny.en",
            stock_engine=False,
            compute_type=compute,
            cpu_threads=args.threads,
            drafter=PromptLookupDrafter() if drafter == "prompt lookup" else None,
        )
        for compute in ("int8", "float32")
        for drafter in ("shipped", "prompt lookup")
    }
    keys = list(models)
    longest = max(clips, key=len)
    for model in models.values():  # every model meets its largest buffers before call 0
        for temperature in (0.0, [0.0, 0.4, 0.8]):
            list(model.transcribe(longest, beam_size=1, temperature=temperature)[0])
    rng = np.random.default_rng(args.seed)
    samples = []
    started = time.time()
    for call in tqdm(range(args.calls), desc="soak"):
        audio = clips[int(rng.integers(len(clips)))]
        if rng.random() < 0.5:  # a random piece, 1 s or more
            length = int(rng.integers(16000, audio.size + 1))
            start = int(rng.integers(0, audio.size - length + 1))
            audio = audio[start : start + length]
        model = models[keys[call % len(keys)]]
        options = dict(beam_size=1, temperature=0.0 if rng.random() < 0.7 else [0.0, 0.4, 0.8])
        segments, _ = model.transcribe(audio, **options)
        text = " ".join(s.text for s in segments)
        samples.append(
            {
                "call": call,
                "seconds": audio.size / 16000,
                "model": "/".join(keys[call % len(keys)]),
                "resident_mb": resident_mb(),
                "open_files": open_files(),
                "threads": threading.active_count(),
                "os_threads": len(os.listdir("/proc/self/task")),
                "characters": len(text),
            }
        )
    warm = samples[max(0, args.calls // 10 - 1)]
    last = samples[-1]
    summary = {
        "what": "resident memory, open files and threads over many transcriptions in one process",
        "calls": args.calls,
        "wall_seconds": time.time() - started,
        "audio_seconds": sum(s["seconds"] for s in samples),
        "resident_mb_after_warm_up": warm["resident_mb"],
        "resident_mb_at_end": last["resident_mb"],
        "resident_growth": last["resident_mb"] / warm["resident_mb"] - 1,
        "resident_growth_second_half": last["resident_mb"] / samples[len(samples) // 2]["resident_mb"] - 1,
        "open_files_after_warm_up": warm["open_files"],
        "open_files_at_end": last["open_files"],
        "os_threads_after_warm_up": warm["os_threads"],
        "os_threads_at_end": last["os_threads"],
        "samples": samples,
    }
    write_result(args.out, summary)
    figure, axes = plt.subplots(1, 2, figsize=(11, 4))
    calls = [s["call"] for s in samples]
    axes[0].plot(calls, [s["resident_mb"] for s in samples])
    axes[0].axvline(warm["call"], color="grey", linestyle="--", linewidth=0.8, label="end of warm-up")
    axes[0].set(xlabel="call", ylabel="resident memory (MiB)", title="memory")
    axes[0].legend()
    axes[1].plot(calls, [s["open_files"] for s in samples], label="open files")
    axes[1].plot(calls, [s["os_threads"] for s in samples], label="threads")
    axes[1].set(xlabel="call", title="handles")
    axes[1].legend()
    figure.suptitle(f"{args.calls} transcriptions, int8 and float32, shipped and prompt-lookup drafters")
    save_figure(figure, args.out.rsplit(".", 1)[0] + ".png")
    print(
        f"resident {warm['resident_mb']:.0f} -> {last['resident_mb']:.0f} MiB ({summary['resident_growth']:+.1%}), "
        f"open files {warm['open_files']} -> {last['open_files']}, threads {warm['os_threads']} -> {last['os_threads']}"
    )


if __name__ == "__main__":
    main()
