"""``ct2-flash transcribe``: transcripts of files, folders and lists of paths."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Dict, List, Optional

# faster-whisper's transcribe() options as flags of the same names (dashes for underscores),
# passed only where given (--temperature, which takes a list, and the flags above them aside).
MORE_OPTIONS = (
    ("condition_on_previous_text", bool),
    ("initial_prompt", str),
    ("task", str),
    ("best_of", int),
    ("patience", float),
    ("length_penalty", float),
    ("repetition_penalty", float),
    ("no_repeat_ngram_size", int),
    ("compression_ratio_threshold", float),
    ("log_prob_threshold", float),
    ("no_speech_threshold", float),
    ("prompt_reset_on_temperature", float),
    ("prefix", str),
    ("suppress_blank", bool),
    ("without_timestamps", bool),
    ("max_initial_timestamp", float),
    ("max_new_tokens", int),
    ("hallucination_silence_threshold", float),
    ("hotwords", str),
)


def add_parser(commands) -> argparse.ArgumentParser:
    """The ``transcribe`` subcommand's arguments."""
    transcribe = commands.add_parser(
        "transcribe",
        help="transcribe files, folders or lists of paths into txt, srt, vtt or json (resumable)",
        description="Transcribe every audio file named: files, folders (searched recursively, sub-folders mirrored "
        "in --output-dir) and .txt/.lst files listing paths. Files whose outputs all exist are skipped, "
        "so the same command resumes an interrupted run; outputs are written whole or not at all; files "
        "that cannot be decoded are listed in OUTPUT_DIR/failures.tsv and the exit code is 1.",
    )
    transcribe.add_argument("files", nargs="+", help="audio files, folders, or .txt/.lst files listing paths")
    transcribe.add_argument("--output-format", default="txt", choices=["txt", "srt", "vtt", "json", "all"])
    transcribe.add_argument("--output-dir", default=".", help="where the files go (default: here)")
    _add_model_options(transcribe.add_argument_group("the model"))
    _add_layout_options(transcribe.add_argument_group("how the files are shared out"))
    _add_transcribe_options(transcribe.add_argument_group("transcribe()'s options"))
    transcribe.set_defaults(handler=run)
    return transcribe


def _add_model_options(transcribe) -> None:
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


def _add_layout_options(transcribe) -> None:
    transcribe.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="the model's replicas, each running one call at a time (num_workers; default: one per core, no more "
        "than the files left to do)",
    )
    transcribe.add_argument(
        "--files-in-flight",
        type=int,
        default=None,
        help="files transcribed at once, threads sharing the model, whose windows the stock worker decodes together "
        "(default: 16 where it batches, else --jobs; each holds its decoded audio, ~230 MB an hour)",
    )
    transcribe.add_argument(
        "--batch-rows",
        type=int,
        default=None,
        help="the most windows one generate() call decodes (default: 16 at int8, 1 at float32: "
        "FlashWhisperModel(batch_rows=...))",
    )
    transcribe.add_argument(
        "--threads", type=int, default=None, help="CPU threads per job (default: the cores divided among the jobs)"
    )
    transcribe.add_argument(
        "--ray",
        nargs="?",
        const="",
        default=None,
        metavar="ADDRESS",
        help="run as a Ray Data job, one model per actor (--jobs: the most actors), on the cluster at ADDRESS "
        "(ray.init's address: auto, ray://HEAD:10001, ...) or, without one, a local Ray instance; every node "
        "must see --output-dir. Needs pip install 'ct2-flash[ray]'",
    )


def _add_transcribe_options(transcribe) -> None:
    transcribe.add_argument("--language", default=None, help="language code (default: the model's, or detected)")
    transcribe.add_argument(
        "--beam-size",
        type=int,
        default=1,
        help="1 (default) decodes speculatively; larger runs CTranslate2's beam search",
    )
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
    for name, kind in MORE_OPTIONS:
        transcribe.add_argument(
            f"--{name.replace('_', '-')}",
            **(dict(action=argparse.BooleanOptionalAction) if kind is bool else dict(type=kind)),
            default=None,
            help=f"transcribe()'s {name} (default: faster-whisper's)",
        )


def run(args: argparse.Namespace) -> int:
    from ct2_flash.jobs.collection import CollectionError, check_output_folder, find_audio, pending
    from ct2_flash.jobs.outputs import FORMATS

    formats = FORMATS if args.output_format == "all" else (args.output_format,)
    layout = (args.threads, args.jobs, args.files_in_flight, args.batch_rows)
    if args.beam_size < 1 or any(value is not None and value < 1 for value in layout):
        print(
            "ct2-flash transcribe: --beam-size, --threads, --jobs, --files-in-flight and --batch-rows must be >= 1",
            file=sys.stderr,
        )
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
    todo = pending(files, args.output_dir, formats)
    durations = _durations(todo) if len(files) > 1 else None  # one file: no bar
    model, results = _results(args, files, todo, formats)
    if model is False:
        return 2
    started = time.perf_counter()
    try:
        counts, failures, audio_seconds = _follow(results, len(files), durations)
    except CollectionError as error:  # --ray: Ray missing, or the cluster does not answer
        print(f"ct2-flash transcribe: {error}", file=sys.stderr)
        return 2
    except _Interrupted as interrupted:
        print(
            f"ct2-flash transcribe: interrupted; {interrupted.done} file(s) transcribed and written, the rest "
            "untouched (run the same command again to go on)",
            file=sys.stderr,
        )
        return 130
    elapsed = time.perf_counter() - started
    failures_path = _write_failures(args.output_dir, failures)
    print(
        f"{counts['done']} transcribed, {counts['skipped']} skipped (outputs existed), {counts['failed']} failed"
        + (f" (listed in {failures_path})" if failures else "")
        + f"; {_clock(audio_seconds)} of audio ({audio_seconds / 3600:.2f} h) in {_clock(elapsed)}"
        + (f" (real-time factor {elapsed / audio_seconds:.3f})" if audio_seconds else ""),
        file=sys.stderr,
    )
    _print_calls(model)
    return 1 if failures else 0


def _results(args: argparse.Namespace, files, todo, formats):
    """(the model, or None on Ray or with nothing to do (``todo``: the files without their
    outputs), or False where it could not be made; the iterator of ``FileResult``s), with the
    jobs and threads of ``default_layout``."""
    from ct2_flash.jobs.collection import default_layout, transcribe_found, transcribe_on_ray

    jobs_given = args.jobs
    args.jobs, args.threads = default_layout(len(todo), args.jobs, args.threads)
    if args.ray is not None:
        actors = None if jobs_given is None else args.jobs
        options = _transcribe_options(args)
        return None, transcribe_on_ray(
            files, args.output_dir, formats, _model_options(args), address=args.ray or None, actors=actors, **options
        )
    model = _transcription_model(args) if todo else None
    if model is False:
        return False, iter(())
    results = transcribe_found(
        files, args.output_dir, formats, model, args.jobs, args.files_in_flight, **_transcribe_options(args)
    )
    return model, results


class _Interrupted(Exception):
    """Ctrl-C while following the results, after ``done`` files were written."""

    def __init__(self, done: int) -> None:
        super().__init__(done)
        self.done = done


def _durations(todo) -> Optional[Dict[str, Optional[float]]]:
    """Path -> the duration its container states, for the files a run transcribes (None where
    there are more than ``MAX_PROBED``: the ETA then counts files)."""
    from ct2_flash.jobs.collection import MAX_PROBED, audio_duration

    if len(todo) > MAX_PROBED:
        return None
    return {audio.path: audio_duration(audio.path) for audio in todo}


class _Eta:
    """Time left by audio: the durations of the files still to do, at the rate (audio seconds
    a wall second) the finished ones went; a file whose container states no duration counts as
    the mean of those that do."""

    def __init__(self, durations: Dict[str, Optional[float]]) -> None:
        known = [d for d in durations.values() if d is not None]
        mean = sum(known) / len(known) if known else 0.0
        self._left = {path: (mean if d is None else d) for path, d in durations.items()}
        self._remaining = sum(self._left.values())
        self._finished = 0.0

    def finished(self, path: str) -> None:
        """A file of the run is done (or failed): its audio is no longer to do."""
        duration = self._left.pop(path, 0.0)
        self._remaining -= duration
        self._finished += duration

    def seconds(self, elapsed: float) -> Optional[float]:
        """Seconds left, or None before the first file has finished."""
        if self._finished <= 0 or elapsed <= 0:
            return None
        return max(0.0, self._remaining) * elapsed / self._finished


def _follow(results, total: int, durations: Optional[Dict[str, Optional[float]]] = None):
    """Count the results as they come, with a progress bar (files, audio time, real-time
    factor, and the time left by audio where the files' durations are known) and each failure
    as it happens. Returns (counts by status, failure lines, audio seconds); ``_Interrupted``
    on Ctrl-C."""
    from tqdm import tqdm

    counts = {"done": 0, "skipped": 0, "failed": 0}
    failures: List[str] = []
    audio_seconds, started = 0.0, time.perf_counter()
    eta = _Eta(durations) if durations else None
    # With durations the bar's own time left (by files) gives way to the one by audio.
    form = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]" if eta else None
    bar = tqdm(total=total, unit="file", disable=total < 2, file=sys.stderr, bar_format=form)
    try:
        for result in results:
            counts[result.status] += 1
            audio_seconds += result.audio_seconds
            if result.status == "failed":
                failures.append(f"{result.path}\t{result.error}")
                bar.write(f"ct2-flash transcribe: {result.path}: {result.error}", file=sys.stderr)
            elapsed = time.perf_counter() - started
            if eta is not None and result.status != "skipped":
                eta.finished(result.path)
            left = eta.seconds(elapsed) if eta is not None else None
            bar.set_postfix_str(
                f"{_clock(audio_seconds)} of audio, real-time factor "
                f"{elapsed / audio_seconds if audio_seconds else 0:.3f}"
                + ("" if left is None else f", {_clock(left)} left"),
                refresh=False,
            )
            bar.update(1)
    except KeyboardInterrupt:
        raise _Interrupted(counts["done"]) from None
    finally:
        bar.close()
    return counts, failures, audio_seconds


def _print_calls(model) -> None:
    """How the model's calls were served (a ct2-flash model only)."""
    if model is None or not hasattr(model, "spec_stats"):
        return
    stats = model.spec_stats
    print(
        f"calls: {stats.rows_in_loop} speculative, {stats.rows_in_generate} through CTranslate2's generate(), "
        f"{stats.unchanged_calls} not speculative"
        + (
            f"; {stats.tokens_per_call:.2f} tokens per target call, acceptance {stats.acceptance_rate:.1%}"
            if stats.target_calls
            else ""
        ),
        file=sys.stderr,
    )


def _transcribe_options(args: argparse.Namespace) -> dict:
    """``transcribe()``'s options from the flags; those not given keep faster-whisper's defaults."""
    options = dict(
        beam_size=args.beam_size,
        language=args.language,
        word_timestamps=args.word_timestamps,
        vad_filter=args.vad_filter,
    )
    if args.temperature is not None:
        options["temperature"] = args.temperature[0] if len(args.temperature) == 1 else tuple(args.temperature)
    for name, _ in MORE_OPTIONS:
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    return options


def _write_failures(output_dir: str, failures: List[str]) -> str:
    """``OUTPUT_DIR/failures.tsv`` listing this run's failures (path, tab, reason), or removed
    where none failed (an earlier run's list: those files are done now); returns its path."""
    path = os.path.join(output_dir, "failures.tsv")
    if failures:
        with open(path, "w", encoding="utf-8") as stream:
            stream.write("\n".join(failures) + "\n")
    elif os.path.isfile(path):
        os.remove(path)
    return path


def _clock(seconds: float) -> str:
    """H:MM:SS."""
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _model_options(args: argparse.Namespace) -> dict:
    """``FlashWhisperModel``'s arguments from the flags."""
    return dict(
        model_size_or_path=args.model,
        device=args.device,
        compute_type=args.compute_type,
        cpu_threads=args.threads,
        num_workers=args.jobs if args.ray is None else 1,
        near_exact=args.near_exact,
        stock_engine=args.stock_engine,
        drafter=args.drafter,
        batch_rows=args.batch_rows,
    )


def _transcription_model(args: argparse.Namespace):
    """The model ``transcribe`` decodes with; False (the reason printed) where it cannot be built."""
    from ct2_flash.adapter.whisper_model import FlashWhisperModel
    from ct2_flash.drafting.files import CheckpointError, DrafterMismatchError

    try:
        return FlashWhisperModel(**_model_options(args))
    except (CheckpointError, DrafterMismatchError) as error:
        print(f"ct2-flash transcribe: {error}", file=sys.stderr)
    except (ValueError, RuntimeError) as error:  # CTranslate2: no such device, or a compute type it lacks
        print(
            f"ct2-flash transcribe: cannot load {args.model} on {args.device} at {args.compute_type}: {error}",
            file=sys.stderr,
        )
    return False
