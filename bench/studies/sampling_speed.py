"""Temperature sampling through the default model: draft rounds and speed against faster-whisper.

faster-whisper samples when its temperature fallback fires (or when a client asks for a
temperature): every window at that temperature, ``best_of`` hypotheses each. This times
``transcribe(audio, beam_size=1, temperature=T)`` on real clips, faster-whisper and the default
``FlashWhisperModel`` (adaptive: the policy routes each call, DraftPause pauses drafting) on
the same engine (the patched runtime, no stock worker), interleaved per clip, and records how
many rounds drafted and how many rows the loop and ``generate()`` decoded. The samples differ
between the systems (the distribution is the same), so speeds are ratios of total wall time
over many draws. Each checkout is measured in a child process with it first on ``PYTHONPATH``
(older ones too: a worktree of another commit), to compare code before and after a change on
the same machine:

    git worktree add /tmp/before BEFORE   # BEFORE: the commit to compare against
    python bench/studies/sampling_speed.py --checkouts /tmp/before . --out bench/results/sampling_speed/sampling.json
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
import time


def measure(args: argparse.Namespace) -> dict:
    """Runs in the child: only the checkout's own ct2_flash and faster-whisper are imported."""
    from faster_whisper import WhisperModel, decode_audio

    import ct2_flash
    from ct2_flash import FlashWhisperModel

    manifest = os.path.expanduser(f"~/.cache/ct2_flash/speech/{args.speech_set}/manifest.tsv")
    with open(manifest, encoding="utf-8") as stream:
        paths = [line.split("\t")[0] for line in list(stream)[1:] if line.strip()]  # after the header
    paths = paths[: args.limit]
    audio = [decode_audio(os.path.join(os.path.dirname(manifest), p) if not os.path.isabs(p) else p) for p in paths]
    path = ct2_flash.resolve_model("tiny.en")
    accepted = inspect.signature(FlashWhisperModel.__init__).parameters
    extra = {name: False for name in ("stock_engine", "redecodes") if name in accepted}
    baseline = WhisperModel(path, compute_type=args.compute_type, cpu_threads=args.threads)
    flash = FlashWhisperModel(
        path, compute_type=args.compute_type, cpu_threads=args.threads, adaptive=not args.every_round, **extra
    )

    def run(model, samples, temperature) -> float:
        # Its own clock: ct2_flash.benchmark.scripts imports ct2_flash modules an older checkout may not have.
        started = time.perf_counter()
        segments, _ = model.transcribe(samples, beam_size=1, temperature=temperature, best_of=args.best_of)
        list(segments)
        return time.perf_counter() - started

    for samples in audio[:2]:  # warm-up: both models, greedy and sampled
        for model in (baseline, flash):
            run(model, samples, 0.0), run(model, samples, args.temperatures[0])
    results = []
    for temperature in args.temperatures:
        flash.reset_spec_stats()
        seconds = {"faster_whisper": 0.0, "ct2_flash": 0.0}
        for _ in range(args.repeats):
            for samples in audio:
                seconds["faster_whisper"] += run(baseline, samples, temperature)
                seconds["ct2_flash"] += run(flash, samples, temperature)
        stats = flash.spec_stats
        results.append(
            {
                "temperature": temperature,
                "seconds": seconds,
                "speedup": seconds["faster_whisper"] / seconds["ct2_flash"],
                "draft_rounds": stats.draft_rounds,
                "speculative_calls": stats.rows_in_loop,
                "generate_rows": stats.rows_in_generate,
                "windows_drafting_stopped": stats.windows_drafting_stopped,
                "tokens_per_target_call": stats.tokens_per_call if stats.target_calls else None,
                "acceptance_rate": stats.acceptance_rate if stats.target_calls else None,
            }
        )
        print(results[-1], file=sys.stderr)
    checkout = os.path.dirname(os.path.dirname(os.path.abspath(ct2_flash.__file__)))
    commit = subprocess.run(
        ["git", "-C", checkout, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    return {"commit": commit, "clips": paths, "audio_seconds": sum(len(a) for a in audio) / 16000, "results": results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkouts", nargs="+", default=["."], help="repository roots to measure, in order")
    parser.add_argument("--speech-set", default="mfa")
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--temperatures", nargs="+", type=float, default=[0.6, 1.0])
    parser.add_argument("--best-of", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compute-type", default="float32")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--every-round", action="store_true", help="adaptive=False: every call drafts every round")
    parser.add_argument("--out")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args)))
        return
    if not args.out:
        parser.error("--out is required")
    from ct2_flash.benchmark.scripts import write_result

    runs = []
    for checkout in args.checkouts:
        env = dict(
            os.environ, PYTHONPATH=os.pathsep.join([os.path.abspath(checkout), os.environ.get("PYTHONPATH", "")])
        )
        child = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--child", *sys.argv[1:]],
            env=env,
            check=True,
            stdout=subprocess.PIPE,
            text=True,
        )
        runs.append(json.loads(child.stdout.strip().splitlines()[-1]))
    write_result(
        args.out,
        {
            "what": __doc__.split("\n")[0],
            "every_round": args.every_round,
            "best_of": args.best_of,
            "repeats": args.repeats,
            "compute_type": args.compute_type,
            "threads": args.threads,
            "runs": runs,
        },
        echo=("runs",),
    )


if __name__ == "__main__":
    main()
