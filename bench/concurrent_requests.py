"""A server's concurrent requests: N client threads sharing one model, each taking the next
request (a real clip) as it finishes the last, as faster-whisper-server and wyoming serve them,
for N = 1, 2, 4, 8. ct2-flash's default model against faster-whisper on tuned stock (tcmalloc
preloaded), each in its own process, in the layouts a server's user sets: ``cpu_threads`` x
``num_workers`` of 2 x 1 and 1 x 2. At int8 ct2-flash's worker runs the requests' concurrent
``generate()`` calls as one where they share a prompt layout and options (``stock/batching.py``).
Systems are named ``KIND WxT``: ``num_workers`` x ``cpu_threads`` (jobs x threads, as in
``bench/collections.py``).

Greedy or beam search at ``temperature=0``, the lower of ``--repeats`` interleaved runs; every
request's segments compared with tuned stock's.

    python bench/concurrent_requests.py --clients 1 2 4 8 --beam-size 1 --out bench/results/batching/concurrent_beam1.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

LAYOUTS = ((2, 1), (1, 2))  # (cpu_threads, num_workers)


def child(kind: str, model_path: str, files: list, clients: int, threads: int, workers: int, beam: int) -> dict:
    """One system's run, in its own process (the tuned one imports nothing from ct2_flash)."""
    import queue
    import threading
    import time

    from faster_whisper import decode_audio

    options = dict(beam_size=beam, temperature=0.0, language="en")
    if kind == "flash":
        from ct2_flash import FlashWhisperModel

        model = FlashWhisperModel(model_path, compute_type="int8", cpu_threads=threads, num_workers=workers)
    else:
        from faster_whisper import WhisperModel

        model = WhisperModel(model_path, compute_type="int8", cpu_threads=threads, num_workers=workers)
    audio = [decode_audio(path) for path in files]
    list(model.transcribe(audio[0], **options)[0])  # warm: the worker's start, first calls
    requests: "queue.Queue" = queue.Queue()
    for index in range(len(audio)):
        requests.put(index)
    segments: dict = {}

    def serve():
        while True:
            try:
                index = requests.get_nowait()
            except queue.Empty:
                return
            found, _ = model.transcribe(audio[index], **options)
            segments[files[index]] = [[s.text, round(s.start, 3), round(s.end, 3)] for s in found]

    threads_ = [threading.Thread(target=serve) for _ in range(clients)]
    started = time.perf_counter()
    for thread in threads_:
        thread.start()
    for thread in threads_:
        thread.join()
    seconds = time.perf_counter() - started
    rows = None
    if kind == "flash" and model.model.engines.stock is not None:
        rows = {str(k): v for k, v in sorted(model.model.engines.stock.rows_in_calls.items())}
    return {"seconds": seconds, "segments": segments, "requests_by_rows_in_call": rows}


def main() -> None:
    from ct2_flash.benchmark.manifest import read_manifest
    from ct2_flash.benchmark.scripts import machine, write_result
    from ct2_flash.benchmark.speech_sets import fetch
    from ct2_flash.benchmark.stock import stock_environment
    from ct2_flash.engine.models import resolve_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", nargs="+", type=int, default=[1, 2, 4, 8])
    parser.add_argument("--beam-size", type=int, default=1)
    parser.add_argument("--speech-set", default="mfa")
    parser.add_argument("--limit", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default="bench/results/batching/concurrent_beam1.json")
    args = parser.parse_args()
    files = [u.path for u in read_manifest(fetch(args.speech_set))][: args.limit]
    model = resolve_model("tiny.en")
    rows = []
    with tempfile.TemporaryDirectory() as work:
        out = os.path.join(work, "run.json")
        for clients in args.clients:
            systems = [(kind, threads, workers) for threads, workers in LAYOUTS for kind in ("tuned", "flash")]
            runs: dict = {}
            for repeat in range(args.repeats):
                for kind, threads, workers in systems if repeat % 2 == 0 else systems[::-1]:
                    job = json.dumps([kind, model, files, clients, threads, workers, args.beam_size])
                    env = dict(os.environ) if kind == "flash" else stock_environment(tuned=True)
                    subprocess.run(
                        [sys.executable, os.path.abspath(__file__), "--child", job, out], env=env, check=True
                    )
                    with open(out, encoding="utf-8") as stream:
                        runs.setdefault(f"{kind} {workers}x{threads}", []).append(json.load(stream))
            best = {name: min(found, key=lambda run: run["seconds"]) for name, found in runs.items()}
            reference = best["tuned 1x2"]["segments"]
            tuned_best = min(best[f"tuned {w}x{t}"]["seconds"] for t, w in LAYOUTS)
            row = {"clients": clients}
            for name, run in best.items():
                row[name] = {
                    "seconds": run["seconds"],
                    "files_identical": sum(run["segments"].get(path) == reference[path] for path in files),
                    "requests_by_rows_in_call": run["requests_by_rows_in_call"],
                }
            row["flash best / tuned best"] = tuned_best / min(best[f"flash {w}x{t}"]["seconds"] for t, w in LAYOUTS)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    write_result(
        args.out,
        {
            "machine": machine(),
            "command": " ".join(sys.argv),
            "beam_size": args.beam_size,
            "files": len(files),
            "repeats": args.repeats,
            "results": rows,
        },
    )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        result = child(*json.loads(sys.argv[2]))
        with open(sys.argv[3], "w", encoding="utf-8") as stream:
            json.dump(result, stream)
    else:
        main()
