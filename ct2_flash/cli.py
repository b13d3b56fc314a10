"""``ct2-flash`` command line: ``demo`` transcribes the bundled sample with both systems."""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
from typing import List, Optional

DEFAULT_SAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "sample.ogg")


def _demo(args: argparse.Namespace) -> int:
    from faster_whisper import WhisperModel, decode_audio

    from .measure import measure
    from .models import resolve_model
    from .whisper_model import FlashWhisperModel

    try:
        audio = decode_audio(args.audio)
    except Exception as error:  # PyAV raises many types for unreadable input
        print(f"ct2-flash: cannot read audio {args.audio!r}: {error}", file=sys.stderr)
        return 2
    if audio.size == 0:
        print(f"ct2-flash: {args.audio!r} contains no audio", file=sys.stderr)
        return 2
    path = resolve_model(args.model)
    options = dict(compute_type=args.compute_type, cpu_threads=args.threads)
    baseline = WhisperModel(path, **options)
    flash = FlashWhisperModel(path, num_draft_tokens=args.k, **options)
    transcribe = dict(beam_size=1, without_timestamps=args.no_timestamps)

    measure(baseline, audio, **transcribe)  # warm-up
    measure(flash, audio, **transcribe)
    flash.reset_spec_stats()
    base_runs, flash_runs = [], []
    for _ in range(args.repeats):  # interleaved, so load drift hits both alike
        base_runs.append(measure(baseline, audio, **transcribe))
        flash_runs.append(measure(flash, audio, **transcribe))

    stats = flash.spec_stats
    identical = all(b.tokens == f.tokens for b, f in zip(base_runs, flash_runs))
    whole = statistics.median(b.whole_seconds / f.whole_seconds for b, f in zip(base_runs, flash_runs))
    decode = statistics.median(b.decode_seconds / f.decode_seconds for b, f in zip(base_runs, flash_runs))
    duration = audio.size / 16000
    print(flash_runs[-1].text)
    print()
    print(f"audio: {args.audio} ({duration:.1f} s), model {args.model}, {args.compute_type}, "
          f"{args.threads} thread(s), drafter {type(flash.drafter).__name__}, K={args.k}")
    print(f"tokens identical to faster-whisper greedy: {'yes' if identical else 'NO'}")
    print(f"speed vs faster-whisper (median of {args.repeats}): whole path {whole:.2f}x, decode part {decode:.2f}x")
    print(f"acceptance rate {stats.acceptance_rate:.1%}, {stats.tokens_per_call:.2f} tokens per target call")
    return 0 if identical else 1


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="ct2-flash", description=__doc__)
    commands = parser.add_subparsers(dest="command")
    demo = commands.add_parser("demo", help="transcribe a file with ct2-flash and with faster-whisper, compare")
    demo.add_argument("audio", nargs="?", default=DEFAULT_SAMPLE, help="audio file (default: bundled sample)")
    demo.add_argument("--model", default="tiny.en", help="embedded model name or model directory")
    demo.add_argument("--compute-type", default="int8", choices=["int8", "float32", "int8_float32", "int16"])
    demo.add_argument("--threads", type=int, default=2)
    demo.add_argument("--k", type=int, default=8, help="draft tokens per verification")
    demo.add_argument("--repeats", type=int, default=3)
    demo.add_argument("--no-timestamps", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.command in (None, "demo"):
        if args.command is None:
            args = parser.parse_args(["demo", *(argv or [])])
        return _demo(args)
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
