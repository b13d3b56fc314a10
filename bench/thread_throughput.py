"""Throughput when threads share one model (faster-whisper's ``num_workers``): audio seconds
transcribed per wall second by 1-4 threads, faster-whisper against ct2-flash on the same
engine and settings (``stock_engine=False``), the same clips split among the threads. With
``--stock``, also the default ``FlashWhisperModel`` (its stock worker serves ``num_workers``
requests at once) against faster-whisper on stock ctranslate2, whose threads run in its own
process.

Speculation spends spare compute; once the threads fill the cores there is none, and the loop
steps aside (a call that finds it busy goes to ``generate()``). Writes JSON.

    python bench/thread_throughput.py --threads 1 2 3 4 --stock --out bench/results/thread_throughput/default_vs_stock.json
"""

from __future__ import annotations

import argparse

from ct2_flash.benchmark.scripts import interleaved, machine, write_result

# Greedy, no fallback: every system decodes the same calls.
OPTIONS = dict(beam_size=1, temperature=0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2, 3, 4])
    parser.add_argument("--compute-type", default="int8")
    parser.add_argument("--cpu-threads", type=int, default=2, help="CTranslate2 threads per model")
    parser.add_argument("--speech-set", default="mfa")
    parser.add_argument("--limit", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--stock",
        action="store_true",
        help="also the default model (stock worker on) against faster-whisper on stock ctranslate2",
    )
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    from faster_whisper import WhisperModel

    from ct2_flash import FlashWhisperModel, resolve_model
    from ct2_flash.benchmark.manifest import read_manifest
    from ct2_flash.benchmark.runner import load_audio
    from ct2_flash.benchmark.speech_sets import fetch
    from ct2_flash.benchmark.stock import StockWorker, local_baseline
    from ct2_flash.benchmark.stock_worker import shared
    from ct2_flash.stock.location import STOCK_CTRANSLATE2

    utterances = read_manifest(fetch(args.speech_set, ""))[: args.limit]
    audio = load_audio(utterances)
    clips = [audio[u.path] for u in utterances]
    seconds = sum(c.size for c in clips) / 16000
    path = resolve_model("tiny.en")
    results = []
    for workers in args.threads:
        options = dict(compute_type=args.compute_type, cpu_threads=args.cpu_threads, num_workers=workers)
        models = {
            "faster-whisper": WhisperModel(path, **options),
            "ct2-flash": FlashWhisperModel(path, stock_engine=False, **options, redecodes=False),
        }
        stock = None
        if args.stock:
            models["ct2-flash, default"] = FlashWhisperModel(path, **options, redecodes=False)
            python, directory = local_baseline()
            stock = StockWorker(python, path, args.compute_type, args.cpu_threads, directory, num_workers=workers)
        # Threads share each model exactly as in the stock baseline's process: one function for both.
        systems = {
            name: (lambda part=None, model=model, workers=workers: shared(model, part or clips, workers, OPTIONS))
            for name, model in models.items()
        }
        if stock is not None:
            systems["faster-whisper, stock"] = lambda part=None, stock=stock, workers=workers: stock.shared(
                {str(index): audio for index, audio in enumerate(part or clips)}, workers, **OPTIONS
            )
        try:
            for system in systems.values():  # warm-up, on as many clips as threads
                system(clips[:workers])
            walls = interleaved(systems, args.repeats, warmup=0)
        finally:
            if stock is not None:
                stock.close()
        stats = models["ct2-flash"].spec_stats
        # Each call returned (seconds, tokens per clip); greedy without fallback, so every repeat
        # of a system must give its reference's tokens (the same engine's, or stock's).
        times = {name: [wall for wall, _ in calls] for name, calls in walls.items()}
        references = {"ct2-flash": "faster-whisper", "ct2-flash, default": "faster-whisper, stock"}
        identical = {
            name: sum(
                all(got[index] == walls[reference][0][1][index] for _, got in walls[name])
                for index in range(len(clips))
            )
            for name, reference in references.items()
            if name in walls
        }
        row = {
            "threads": workers,
            **{f"{name} audio s per s": seconds / min(wall) for name, wall in times.items()},
            "ratio": min(times["faster-whisper"]) / min(times["ct2-flash"]),
            **(
                {"ratio, default vs stock": min(times["faster-whisper, stock"]) / min(times["ct2-flash, default"])}
                if stock is not None
                else {}
            ),
            **{f"{name}: clips identical to {references[name]}": count for name, count in identical.items()},
            "speculative rows": stats.rows_in_loop,
            "generate() rows": stats.rows_in_generate,
            "busy calls": stats.busy_calls,
        }
        for model in models.values():
            if isinstance(model, FlashWhisperModel):
                model.model.engines.close()  # its stock worker, if it has one
        results.append(row)
        print(row)
    document = {
        "what": "throughput of threads sharing one model, faster-whisper vs ct2-flash (best of repeats)",
        "compute_type": args.compute_type,
        "cpu_threads": args.cpu_threads,
        "audio_seconds": seconds,
        "utterances": len(clips),
        "machine": machine(),
        "stock_ctranslate2": STOCK_CTRANSLATE2 if args.stock else None,
        "results": results,
    }
    write_result(args.out, document)


if __name__ == "__main__":
    main()
