"""``ct2-flash stream``: replay a file as a live stream."""

from __future__ import annotations

import argparse
import json
import sys

from ct2_flash.cli.common import read_audio


def add_parser(commands) -> argparse.ArgumentParser:
    """The ``stream`` subcommand's arguments."""
    stream = commands.add_parser(
        "stream", help="replay a file as a live stream (LocalAgreement-2), time each iteration"
    )
    stream.add_argument("audio", help="audio file")
    stream.add_argument("--chunk", type=float, default=1.0, help="seconds of audio per iteration (default 1.0)")
    stream.add_argument("--model", default="tiny.en", help="embedded model name or model directory")
    stream.add_argument("--compute-type", default="int8", choices=["int8", "float32", "int8_float32", "int16"])
    stream.add_argument("--threads", type=int, default=2)
    stream.add_argument("--language", default=None, help="language code (default: the model's, or detected)")
    stream.add_argument(
        "--no-wait", action="store_true", help="feed chunks as fast as they are processed, not in real time"
    )
    stream.add_argument("--baseline", action="store_true", help="run the same policy on plain faster-whisper")
    stream.add_argument(
        "--near-exact", action="store_true", help="FlashWhisperModel(near_exact=True): the loop at int8 too"
    )
    stream.add_argument("--json", default="", help="write per-iteration times, lag and the committed text here")
    stream.set_defaults(handler=run)
    return stream


def run(args: argparse.Namespace) -> int:

    from faster_whisper import WhisperModel

    from ct2_flash.adapter.whisper_model import FlashWhisperModel
    from ct2_flash.benchmark.machine import machine
    from ct2_flash.benchmark.replay import as_records, replay, summary
    from ct2_flash.engine.models import resolve_model
    from ct2_flash.jobs.streaming import OnlineProcessor, StreamOptions, text_of

    audio = read_audio(args.audio)
    if audio is None:
        return 2
    if not args.chunk > 0:
        print(f"ct2-flash stream: --chunk must be > 0 seconds, got {args.chunk}", file=sys.stderr)
        return 2
    path = resolve_model(args.model)
    options = dict(compute_type=args.compute_type, cpu_threads=args.threads)
    model = (
        WhisperModel(path, **options)
        if args.baseline
        else FlashWhisperModel(path, near_exact=args.near_exact, **options)
    )
    processor = OnlineProcessor(model, StreamOptions(language=args.language))

    def show(words) -> None:
        print(f"{words[0].start:8.2f} {words[-1].end:8.2f} {text_of(words)}", flush=True)

    iterations = replay(processor, audio, args.chunk, wait=not args.no_wait, on_commit=show)
    duration = audio.size / 16000
    document = {
        "audio": args.audio,
        "audio_seconds": duration,
        "model": args.model,
        "compute_type": args.compute_type,
        "threads": args.threads,
        "chunk_seconds": args.chunk,
        "real_time_pace": not args.no_wait,
        "machine": machine(),
        "system": "faster-whisper (this environment's engine)" if args.baseline else "ct2-flash",
        "summary": summary(iterations, duration),
        "committed": text_of(processor.committed),
        "iterations": as_records(iterations),
    }
    if not args.baseline:
        document["loop"] = model.spec_stats.redecode_counts()
        model.model.engines.close()
    result = document["summary"]
    print(
        f"{result['iterations']} iterations: {result['mean_iteration_seconds']:.3f} s mean, "
        f"{result['p95_iteration_seconds']:.3f} s p95 per iteration; real-time factor {result['real_time_factor']:.2f}"
        + (f"; final lag {result['final_lag_seconds']:.2f} s" if result["final_lag_seconds"] is not None else ""),
        file=sys.stderr,
    )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as stream:
            json.dump(document, stream, indent=2)
    return 0
