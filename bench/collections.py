"""Whole collections: audio hours transcribed per hour of wall time, by layout, on this machine.

Each system transcribes the same folder of real speech (the ``mfa`` clips and the long
recordings ``long_recordings.py`` writes: short and long files) in a process of its own, in
turns, greedy at ``temperature=0``, the lower of ``--repeats`` runs, the model loaded before
the clock starts:

- ``flash JxT``: ``ct2_flash.transcribe_files`` (what ``ct2-flash transcribe`` runs), J jobs of T
  threads on one ``FlashWhisperModel(cpu_threads=T, num_workers=J)``, outputs written, its
  default files in flight (16 where the worker batches ``generate()`` calls: int8);
- ``flash JxT unbatched``: the same with ``batch_rows=1`` (J files in flight, no batching);
- ``stock JxT``: faster-whisper on stock ctranslate2, J Python threads on one
  ``WhisperModel(cpu_threads=T, num_workers=J)``, the loop its users write;
- ``tuned JxT``: the same with tcmalloc preloaded (``stock/allocator.py``);
- ``... 1 core``: the same pinned to one core (``taskset``), for how throughput scales;
- ``pipeline B``: faster-whisper's ``BatchedInferencePipeline`` at ``batch_size=B`` (tuned, one
  process of 2 threads, files one after another): its throughput, and how many of its files
  are sequential ``transcribe()``'s (it batches VAD chunks of one file and changes the output).

Every system's segments (text, start, end) are compared per file with ``stock 1x2``'s. Peak
resident memory of the process (and of ct2-flash's worker) is recorded per system.

    python bench/collections.py --compute-type int8 --repeats 2 --out bench/results/collections/int8.json
    python bench/collections.py --beam-size 5 --systems "stock 1x2" "tuned 1x2" "tuned 2x1" "flash 2x1" \
        "flash 2x1 unbatched" "pipeline 8" "pipeline 16" --out bench/results/batching/folder_beam5.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# (name, kind, jobs, threads, one core)
SYSTEMS = (
    ("stock 1x2", "stock", 1, 2, False),
    ("tuned 1x2", "tuned", 1, 2, False),
    ("tuned 2x1", "tuned", 2, 1, False),
    ("stock 2x1", "stock", 2, 1, False),
    ("flash 1x2", "flash", 1, 2, False),
    ("flash 2x1", "flash", 2, 1, False),
    ("flash 2x1 unbatched", "flash-unbatched", 2, 1, False),
    ("tuned 1 core", "tuned", 1, 1, True),
    ("flash 1 core", "flash", 1, 1, True),
    # (name, kind, batch size, threads, one core)
    ("pipeline 8", "pipeline", 8, 2, False),
    ("pipeline 16", "pipeline", 16, 2, False),
)


def child(kind: str, jobs: int, threads: int, model_path: str, compute_type: str, files: list, beam: int) -> dict:
    """One system's run (in its own process; a stock child imports nothing from ct2_flash)."""
    from concurrent.futures import ThreadPoolExecutor

    options = dict(beam_size=beam, temperature=0.0, language="en")
    batching = {}
    if kind.startswith("flash"):
        from ct2_flash import FlashWhisperModel, transcribe_files

        model = FlashWhisperModel(
            model_path,
            compute_type=compute_type,
            cpu_threads=threads,
            num_workers=jobs,
            batch_rows=1 if kind == "flash-unbatched" else None,
        )
        model.transcribe(files[0], **options)  # the worker's start and first call, as for the others
        with tempfile.TemporaryDirectory() as out:
            started = time.perf_counter()
            results = list(transcribe_files(files, out, ("json",), model=model, jobs=jobs, **options))
            seconds = time.perf_counter() - started
            segments = {}
            for result in results:
                with open(result.outputs[0], encoding="utf-8") as stream:
                    document = json.load(stream)
                segments[result.path] = [[s["text"], s["start"], s["end"]] for s in document["segments"]]
        worker = model.model.engines.stock
        worker_kb = _peak_kb(worker._process.pid) if worker is not None and worker._process is not None else None
        if worker is not None:
            batching = {
                "requests_by_rows_in_call": {str(k): v for k, v in sorted(worker.rows_in_calls.items())},
                # [requests, round-trip seconds, the worker's seconds] per kind, the warm-up file's included
                "worker_timings": worker.timings,
            }
    elif kind == "pipeline":
        from faster_whisper import BatchedInferencePipeline, WhisperModel

        pipeline = BatchedInferencePipeline(WhisperModel(model_path, compute_type=compute_type, cpu_threads=threads))
        list(pipeline.transcribe(files[0], batch_size=jobs, **options)[0])
        started = time.perf_counter()
        segments = {}
        for path in files:
            found, _ = pipeline.transcribe(path, batch_size=jobs, **options)
            segments[path] = [[s.text, round(s.start, 3), round(s.end, 3)] for s in found]
        seconds = time.perf_counter() - started
        worker_kb = None
    else:
        from faster_whisper import WhisperModel

        model = WhisperModel(model_path, compute_type=compute_type, cpu_threads=threads, num_workers=jobs)
        list(model.transcribe(files[0], **options)[0])

        def one(path):
            found, _ = model.transcribe(path, **options)
            return path, [[s.text, round(s.start, 3), round(s.end, 3)] for s in found]

        started = time.perf_counter()
        with ThreadPoolExecutor(jobs) as pool:
            segments = dict(pool.map(one, files))
        seconds = time.perf_counter() - started
        worker_kb = None
    import resource

    return {
        "seconds": seconds,
        "segments": segments,
        "peak_rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "worker_peak_rss_kb": worker_kb,
        **batching,
    }


def _peak_kb(pid: int):
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as stream:
            for line in stream:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def main() -> None:
    from ct2_flash.benchmark.manifest import read_manifest
    from ct2_flash.benchmark.scripts import machine, save_figure, write_result
    from ct2_flash.benchmark.speech_sets import fetch
    from ct2_flash.benchmark.stock import stock_environment
    from ct2_flash.engine.models import resolve_model
    from ct2_flash.stock.allocator import tuned_allocator

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--compute-type", default="int8")
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--speech-set", default="mfa")
    parser.add_argument(
        "--long-dir",
        default=os.path.expanduser("~/.cache/ct2_flash/long_real"),
        help="long recordings (bench/long_recordings.py writes them)",
    )
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--beam-size", type=int, default=1)
    parser.add_argument("--limit", type=int, default=None, help="the first N short files only (a smoke run)")
    parser.add_argument("--systems", nargs="+", default=[name for name, *_ in SYSTEMS])
    parser.add_argument("--out", default="bench/results/collections/int8.json")
    args = parser.parse_args()
    files = [u.path for u in read_manifest(fetch(args.speech_set))][: args.limit]
    if os.path.isdir(args.long_dir):
        files += sorted(os.path.join(args.long_dir, n) for n in os.listdir(args.long_dir) if n.endswith(".wav"))
    model = resolve_model(args.model)
    from faster_whisper.audio import decode_audio

    audio_seconds = sum(len(decode_audio(path)) / 16000 for path in files)
    chosen = [system for system in SYSTEMS if system[0] in args.systems]
    runs = {name: [] for name, *_ in chosen}
    with tempfile.TemporaryDirectory() as work:
        listing = os.path.join(work, "files.json")
        with open(listing, "w", encoding="utf-8") as stream:
            json.dump(files, stream)
        for repeat in range(args.repeats):
            order = chosen[repeat % len(chosen) :] + chosen[: repeat % len(chosen)]
            for name, kind, jobs, threads, one_core in order:
                out = os.path.join(work, "run.json")
                argv = [
                    sys.executable,
                    os.path.abspath(__file__),
                    "--child",
                    kind,
                    str(jobs),
                    str(threads),
                    model,
                    args.compute_type,
                    listing,
                    out,
                    str(args.beam_size),
                ]
                env = dict(os.environ) if kind.startswith("flash") else stock_environment(tuned=kind != "stock")
                if one_core:
                    argv = ["taskset", "-c", "0", *argv]
                subprocess.run(argv, env=env, check=True)
                with open(out, encoding="utf-8") as stream:
                    runs[name].append(json.load(stream))
                print(f"{name}: {runs[name][-1]['seconds']:.1f} s", file=sys.stderr)
    reference = runs["stock 1x2"][0]["segments"] if "stock 1x2" in runs else None
    results = {}
    for name, *_ in chosen:
        best = min(runs[name], key=lambda run: run["seconds"])
        identical = None
        if reference is not None:
            identical = sum(_alike(best["segments"].get(path), reference[path]) for path in files)
        results[name] = {
            "seconds_min": best["seconds"],
            "seconds_all": [run["seconds"] for run in runs[name]],
            "audio_hours_per_hour": audio_seconds / best["seconds"],
            "files_identical_to_stock_1x2": identical,
            "peak_rss_mb": max(run["peak_rss_kb"] for run in runs[name]) / 1024,
            "worker_peak_rss_mb": (max(run["worker_peak_rss_kb"] or 0 for run in runs[name]) / 1024) or None,
            "requests_by_rows_in_call": best.get("requests_by_rows_in_call"),
            "worker_timings": best.get("worker_timings"),
        }
    document = {
        "machine": machine(),
        "command": " ".join(sys.argv),
        "model": args.model,
        "compute_type": args.compute_type,
        "beam_size": args.beam_size,
        "files": len(files),
        "audio_seconds": audio_seconds,
        "tuned_allocator": tuned_allocator().describe(),
        "repeats": args.repeats,
        "results": results,
    }
    write_result(args.out, document)
    plot(document, os.path.splitext(args.out)[0] + ".png", save_figure)


def _alike(got, expected) -> bool:
    if got is None or len(got) != len(expected):
        return False
    return all(a[0] == b[0] and abs(a[1] - b[1]) < 1e-3 and abs(a[2] - b[2]) < 1e-3 for a, b in zip(got, expected))


def plot(document: dict, path: str, save_figure) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(document["results"])
    figure, axis = plt.subplots(figsize=(8, 3.6))
    axis.bar(names, [document["results"][n]["audio_hours_per_hour"] for n in names])
    axis.set_ylabel("audio hours per hour")
    axis.tick_params(axis="x", rotation=20, labelsize=8)
    axis.set_title(
        f"{document['files']} files, {document['audio_seconds'] / 60:.1f} min, {document['model']} "
        f"{document['compute_type']} beam {document.get('beam_size', 1)}, {document['machine']['cpu']}",
        fontsize=9,
    )
    save_figure(figure, path)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        kind, jobs, threads, model_path, compute_type, listing, out, beam = sys.argv[2:10]
        with open(listing, encoding="utf-8") as stream:
            paths = json.load(stream)
        result = child(kind, int(jobs), int(threads), model_path, compute_type, paths, int(beam))
        with open(out, "w", encoding="utf-8") as stream:
            json.dump(result, stream)
    else:
        main()
