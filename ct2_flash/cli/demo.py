"""``ct2-flash demo``: transcribe a file with ct2-flash and with faster-whisper on stock and the patched engine, compare."""

from __future__ import annotations

import argparse
import statistics
import sys

from ct2_flash.adapter.audio import SAMPLE_AUDIO
from ct2_flash.cli.common import read_audio


def add_parser(commands) -> argparse.ArgumentParser:
    """The ``demo`` subcommand's arguments."""
    demo = commands.add_parser("demo", help="transcribe a file with ct2-flash and with faster-whisper, compare")
    demo.add_argument("audio", nargs="?", default=SAMPLE_AUDIO, help="audio file (default: bundled sample)")
    demo.add_argument("--model", default="tiny.en", help="embedded model name or model directory")
    demo.add_argument("--compute-type", default="int8", choices=["int8", "float32", "int8_float32", "int16"])
    demo.add_argument("--threads", type=int, default=2)
    demo.add_argument("--k", type=int, default=8, help="draft tokens per verification")
    demo.add_argument("--repeats", type=int, default=3)
    demo.add_argument("--no-timestamps", action="store_true")
    demo.add_argument(
        "--near-exact",
        action="store_true",
        help="run the loop at int8 too, where its output equals faster-whisper's on most windows "
        "but not all (docs/exactness.md); without it int8 calls use CTranslate2's generate()",
    )
    demo.add_argument(
        "--stock-engine",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="FlashWhisperModel(stock_engine=...) (default: on)",
    )
    demo.set_defaults(handler=run)
    return demo


def run(args: argparse.Namespace) -> int:
    from faster_whisper import WhisperModel

    from ct2_flash.adapter.whisper_model import FlashWhisperModel
    from ct2_flash.benchmark.measure import measure
    from ct2_flash.engine.models import resolve_model

    audio = read_audio(args.audio)
    if audio is None:
        return 2
    path = resolve_model(args.model)
    options = dict(compute_type=args.compute_type, cpu_threads=args.threads)
    flash = FlashWhisperModel(
        path,
        num_draft_tokens=args.k,
        near_exact=args.near_exact,
        stock_engine=args.stock_engine,
        **options,
        redecodes=False,
    )
    transcribe = dict(beam_size=1, without_timestamps=args.no_timestamps)
    systems, workers = _stock_systems(args, path, audio, transcribe)
    patched = WhisperModel(path, **options)
    systems["patched"] = lambda: measure(patched, audio, **transcribe)
    try:
        runs = _interleaved(systems, lambda: measure(flash, audio, **transcribe), flash, args.repeats)
    finally:
        for worker in workers.values():
            worker.close()
        flash.model.engines.close()
    print(runs["flash"][-1].text)
    print()
    print(
        f"audio: {args.audio} ({audio.size / 16000:.1f} s), model {args.model}, {args.compute_type}, "
        f"{args.threads} thread(s), drafter "
        f"{'none (no call runs the loop)' if flash.model.inexact_reason else type(flash.drafter).__name__}, "
        f"K={args.k}, stock engine "
        f"{'on' if flash.model.engines.stock_active else 'off'}"
    )
    identical = _print_comparisons(runs, systems, workers, args.repeats)
    _print_calls(flash)
    # The promise: the output of the engine ct2-flash stands in for.
    reference = "stock" if flash.model.engines.stock_active and "stock" in identical else "patched"
    return 0 if identical[reference] else 1


def _stock_systems(args: argparse.Namespace, path: str, audio, transcribe: dict):
    """faster-whisper as users run it (stock ctranslate2, in a worker process; plain, and with
    the allocator an informed user preloads): (name -> a timed run, name -> its worker), both
    empty with a message where stock ctranslate2 cannot be run."""
    from ct2_flash.benchmark.stock import local_baseline, stock_systems

    systems, workers = {}, {}
    try:
        python, stock_path = local_baseline()
        workers = stock_systems(python, path, args.compute_type, args.threads, stock_path)
        for name, worker in workers.items():
            systems[name] = lambda worker=worker: worker.measure("demo", audio, seed=0, **transcribe)
    except RuntimeError as error:
        print(f"ct2-flash demo: no comparison with stock ctranslate2: {error}", file=sys.stderr)
    return systems, workers


def _interleaved(systems: dict, flash_run, flash, repeats: int) -> dict:
    """Name -> ``repeats`` measurements of each system and of ct2-flash ("flash"), after a
    warm-up, in turns, so that load drift hits every system alike."""
    for run in systems.values():
        run()
    flash_run()
    flash.reset_spec_stats()
    runs = {name: [] for name in (*systems, "flash")}
    for _ in range(repeats):
        for name, run in systems.items():
            runs[name].append(run())
        runs["flash"].append(flash_run())
    return runs


def _print_comparisons(runs: dict, systems: dict, workers: dict, repeats: int) -> dict:
    """One line per system against ct2-flash; returns name -> whether every run's tokens were
    identical."""
    stock, tuned = workers.get("stock"), workers.get("tuned_stock")
    names = {
        "stock": f"faster-whisper on stock ctranslate2 {stock.version if stock else ''}",
        "tuned_stock": f"the same with {tuned.allocator if tuned else ''} (runs {tuned.allocator_loaded if tuned else ''})",
        "patched": "faster-whisper on the patched runtime",
    }
    identical = {}
    for name in systems:
        pairs = list(zip(runs[name], runs["flash"]))
        identical[name] = all(b.tokens == f.tokens for b, f in pairs)
        whole = statistics.median(b.whole_seconds / f.whole_seconds for b, f in pairs)
        decode = statistics.median(b.decode_seconds / f.decode_seconds for b, f in pairs)
        print(
            f"vs {names[name]}: tokens identical {'yes' if identical[name] else 'NO'}; speed (median of "
            f"{repeats}) whole path {whole:.2f}x, decode part {decode:.2f}x"
        )
    return identical


def _print_calls(flash) -> None:
    """How ct2-flash served its calls, and why none ran in the loop where that is so."""
    stats = flash.spec_stats
    if flash.model.inexact_reason is not None:
        print(
            f"calls: {stats.unchanged_calls} through CTranslate2's generate(): {flash.model.inexact_reason} "
            "(--compute-type float32 runs the exact loop; --near-exact runs this one anyway)"
        )
    else:
        print(
            f"calls: {stats.rows_in_loop} speculative, {stats.rows_in_generate} through CTranslate2's generate() "
            "(the call router's choice until speculation is measured, a few calls in, and wherever it measured slower)"
        )
    if stats.target_calls:
        print(
            f"speculative calls: acceptance rate {stats.acceptance_rate:.1%}, "
            f"{stats.tokens_per_call:.2f} tokens per target call"
        )
