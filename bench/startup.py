"""A process that transcribes one file: start-up, model build and the first call, whole.

Each run is a new Python process (what a command-line run or a serverless call is) that imports
its library, builds tiny.en and transcribes one file greedily; the process's wall time
(interpreter start and exit included, the worker's shutdown with it) is measured from outside,
its phases from inside. Systems, in turns (``ct2_flash.benchmark.scripts.interleaved``):

- ``faster-whisper``: ``WhisperModel`` on stock ctranslate2 (the worker's private install
  first on ``PYTHONPATH``), what its users run;
- ``ct2-flash``: ``FlashWhisperModel("tiny.en")`` with its defaults, imported first;
- ``ct2-flash after faster_whisper``: the same, where the program imported ``faster_whisper``
  (so the patched ``ctranslate2``) before ``ct2_flash``;
- with ``--compare-checkout DIR``, ``ct2-flash at REV``: ``ct2-flash`` from another checkout of
  this repository (first on ``PYTHONPATH``), to measure a change against the code before it in
  one run.

Each runs with PyTorch importable (``torch: installed``; the test install has it) and hidden
(``absent``, as in the default install: ``sys.modules["torch"] = None`` in the child).
Writes JSON: every run, and per case the median of each phase and of the process.

    python bench/startup.py --out bench/results/startup/startup.json
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import statistics
import subprocess
import sys
import time

from ct2_flash.benchmark.scripts import interleaved, write_result

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import json, resource, sys, time
started = time.perf_counter()
system, model, compute_type, audio, threads, torch = sys.argv[1:7]
if torch == "absent":
    sys.modules["torch"] = None  # import torch raises ImportError, as where it is not installed
if system == "faster-whisper":
    from faster_whisper import WhisperModel as Model
else:
    if system == "ct2-flash after faster_whisper":
        import faster_whisper
    from ct2_flash import FlashWhisperModel as Model
imported = time.perf_counter()
model = Model(model, compute_type=compute_type, cpu_threads=int(threads))
built = time.perf_counter()
segments, _ = model.transcribe(audio, beam_size=1)
text = "".join(segment.text for segment in segments)
done = time.perf_counter()
print(json.dumps({"import_s": imported - started, "build_s": built - imported, "transcribe_s": done - built,
                  "text": text, "torch_imported": sys.modules.get("torch") is not None,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

SYSTEMS = ("faster-whisper", "ct2-flash", "ct2-flash after faster_whisper")


def run_once(
    system: str, model: str, compute_type: str, audio: str, threads: int, torch: str, checkout: str = ""
) -> dict:
    """One process: its phases (from inside) and its wall seconds (from outside); ``checkout``,
    a directory whose ``ct2_flash`` the child imports instead of this one."""
    from ct2_flash.stock.location import environment_with, stock_dir

    environment = environment_with(stock_dir() if system == "faster-whisper" else checkout)
    # Python caches compiled modules by default (pip compiles an installed package's): the
    # untimed first round writes ct2-flash's caches, as a user's first run would.
    environment.pop("PYTHONDONTWRITEBYTECODE", None)
    started = time.perf_counter()
    child_system = "ct2-flash" if checkout else system
    # In the checkout: ``python -c`` puts its working directory first on the path.
    result = subprocess.run(
        [sys.executable, "-c", CHILD, child_system, model, compute_type, os.path.abspath(audio), str(threads), torch],
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=checkout or None,
    )
    wall = time.perf_counter() - started
    if result.returncode != 0:
        raise RuntimeError(f"{system} failed:\n{result.stderr}")
    return dict(json.loads(result.stdout.strip().splitlines()[-1]), process_s=wall)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--audio",
        nargs="+",
        default=[
            os.path.join(ROOT, "ct2_flash", "data", "sample.ogg"),
            os.path.join(ROOT, "tests", "data", "clip00_kal16.ogg"),
        ],
    )
    parser.add_argument("--compute-types", nargs="+", default=["int8", "float32"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--torch", nargs="+", default=["installed", "absent"], choices=["installed", "absent"])
    parser.add_argument(
        "--compare-checkout",
        default="",
        help="another checkout of this repository whose ct2-flash runs as one more system",
    )
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "startup", "startup.json"))
    args = parser.parse_args()
    compared = ()
    if args.compare_checkout:
        revision = subprocess.run(
            ["git", "-C", args.compare_checkout, "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        compared = (f"ct2-flash at {revision}",)

    from ct2_flash.engine.models import resolve_model

    path = resolve_model("tiny.en")
    runs = []
    cases = [
        (compute_type, torch, audio)
        for compute_type in args.compute_types
        for torch in args.torch
        for audio in args.audio
    ]
    for compute_type, torch, audio in cases:
        # Without PyTorch, importing faster_whisper first changes nothing: not a case of its own.
        systems = (SYSTEMS if torch == "installed" else SYSTEMS[:2]) + compared
        calls = {
            system: functools.partial(
                run_once,
                system,
                path if system == "faster-whisper" else "tiny.en",
                compute_type,
                audio,
                args.threads,
                torch,
                args.compare_checkout if system in compared else "",
            )
            for system in systems
        }
        # The warm-up round fills the disk and bytecode caches, untimed.
        for system, measured in interleaved(calls, args.repeats, warmup=1).items():
            runs += [
                dict(
                    run,
                    system=system,
                    compute_type=compute_type,
                    torch=torch,
                    audio=os.path.relpath(audio, ROOT),
                    repeat=repeat,
                )
                for repeat, run in enumerate(measured, 1)
            ]
    summary = []
    for (compute_type, torch, audio), group in itertools.groupby(
        runs, key=lambda run: (run["compute_type"], run["torch"], run["audio"])
    ):
        group = list(group)
        baseline = statistics.median(run["process_s"] for run in group if run["system"] == "faster-whisper")
        texts = {run["text"] for run in group}
        for system in SYSTEMS + compared:
            own = [run for run in group if run["system"] == system]
            if not own:
                continue
            medians = {
                key: round(statistics.median(run[key] for run in own), 3)
                for key in ("import_s", "build_s", "transcribe_s", "process_s", "peak_rss_mb")
            }
            summary.append(
                dict(
                    medians,
                    compute_type=compute_type,
                    torch=torch,
                    audio=audio,
                    system=system,
                    vs_faster_whisper=round(baseline / medians["process_s"], 2),
                    torch_imported=sum(run["torch_imported"] for run in own),
                    runs=len(own),
                )
            )
        if len(texts) != 1:
            raise RuntimeError(f"the systems wrote different text for {audio} at {compute_type}: {texts}")
    write_result(
        args.out,
        {
            "command": "python bench/startup.py " + " ".join(sys.argv[1:]),
            "model": "tiny.en",
            "repeats": args.repeats,
            "threads": args.threads,
            "summary": summary,
            "runs": runs,
        },
        echo=("summary",),
    )


if __name__ == "__main__":
    main()
