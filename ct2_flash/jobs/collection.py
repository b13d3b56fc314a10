"""Transcribe a whole collection: files, folders and lists of paths, resumable, one file's failure
never stopping the others.

``find_audio`` turns what a user names into the audio files and where each one's outputs go:
a file given directly writes ``NAME.FORMAT`` at the top of the output folder, a folder's files
mirror its sub-folders below it, and a text file (``.txt``, ``.lst``) lists paths, one per line
(relative to the list's folder; ``#`` starts a comment), each taken as if given directly.
``transcribe_files`` transcribes them with one model and yields a ``FileResult`` per file:
files whose outputs all exist are skipped (a rerun resumes), each file's outputs are written
whole or not at all (``outputs.write_outputs``), and a file that cannot be decoded is a failed
result with its reason, not an exception. ``ct2-flash transcribe`` is its command line.
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence, Set, Tuple

from ct2_flash.jobs.outputs import output_paths, write_outputs

# What a folder's walk takes as audio (by extension, case-insensitive); a file named directly or
# in a list is taken whatever its name.
AUDIO_EXTENSIONS = frozenset(
    {
        ".wav",
        ".mp3",
        ".flac",
        ".ogg",
        ".oga",
        ".opus",
        ".m4a",
        ".aac",
        ".wma",
        ".webm",
        ".mp4",
        ".mkv",
        ".mov",
        ".aif",
        ".aiff",
        ".amr",
        ".3gp",
        ".mka",
    }
)
LIST_EXTENSIONS = frozenset({".txt", ".lst"})


class CollectionError(ValueError):
    """What was named cannot be transcribed as asked (a path that does not exist, two inputs
    whose outputs would be the same files, an output folder that cannot be written); raised
    before anything is transcribed."""


@dataclass(frozen=True)
class AudioFile:
    """One file of a collection.

    Attributes:
        path: the audio file.
        stem: where its outputs go, relative to the output folder, without the format's
            extension: ``NAME`` or ``SUB/FOLDERS/NAME``.
    """

    path: str
    stem: str


@dataclass
class FileResult:
    """What ``transcribe_files`` did with one file.

    Attributes:
        path: the audio file.
        status: "done" (transcribed, outputs written), "skipped" (its outputs existed) or
            "failed" (``error`` says why; no output written).
        outputs: its output files (written, or found when skipped).
        error: why it failed, else None.
        audio_seconds: the audio's duration where it was transcribed, else 0.
        seconds: wall time spent on it.
    """

    path: str
    status: str
    outputs: List[str] = field(default_factory=list)
    error: Optional[str] = None
    audio_seconds: float = 0.0
    seconds: float = 0.0


def find_audio(inputs: Sequence[str]) -> List[AudioFile]:
    """The audio files ``inputs`` name, in order (a folder's sorted), each once.

    Raises:
        CollectionError: a path that does not exist (all of them named), or two files whose
            outputs would be the same (both named).
    """
    found: List[AudioFile] = []
    missing: List[str] = []
    for name in inputs:
        if os.path.isdir(name):
            found += _walk(name)
        elif os.path.isfile(name) and os.path.splitext(name)[1].lower() in LIST_EXTENSIONS:
            found += _listed(name, missing)
        elif os.path.isfile(name):
            found.append(_direct(name))
        else:
            missing.append(name)
    if missing:
        raise CollectionError(f"no such file or folder: {', '.join(missing)}")
    unique: Dict[str, AudioFile] = {}
    by_stem: Dict[str, AudioFile] = {}
    for audio in found:
        real = os.path.realpath(audio.path)
        if real in unique:
            continue  # named twice (a file and its folder, say): transcribed once
        unique[real] = audio
        clash = by_stem.get(audio.stem)
        if clash is not None:
            raise CollectionError(
                f"{clash.path} and {audio.path} would write the same outputs ({audio.stem}.*): name their folders "
                "instead (sub-folders are mirrored in the output folder), or transcribe them into different "
                "--output-dir folders"
            )
        by_stem[audio.stem] = audio
    return list(unique.values())


def _direct(path: str) -> AudioFile:
    return AudioFile(path, os.path.splitext(os.path.basename(path))[0])


def _walk(folder: str) -> List[AudioFile]:
    files = []
    for directory, subfolders, names in os.walk(folder):
        subfolders.sort()
        for name in sorted(names):
            if os.path.splitext(name)[1].lower() in AUDIO_EXTENSIONS and not name.startswith("."):
                path = os.path.join(directory, name)
                relative = os.path.relpath(path, folder)
                files.append(AudioFile(path, os.path.splitext(relative)[0].replace(os.sep, "/")))
    return files


def _listed(list_path: str, missing: List[str]) -> List[AudioFile]:
    base = os.path.dirname(os.path.abspath(list_path))
    files = []
    with open(list_path, encoding="utf-8") as stream:
        for line in stream:
            name = line.split("#", 1)[0].strip()
            if not name:
                continue
            path = name if os.path.isabs(name) else os.path.join(base, name)
            if os.path.isdir(path):
                files += _walk(path)
            elif os.path.isfile(path):
                files.append(_direct(path))
            else:
                missing.append(f"{name} (listed in {list_path})")
    return files


def check_output_folder(output_dir: str) -> None:
    """Make ``output_dir`` if needed and check that files can be written there.

    Raises:
        CollectionError: it cannot be made or written.
    """
    try:
        os.makedirs(output_dir, exist_ok=True)
        probe = os.path.join(output_dir, f".ct2-flash-write-check-{os.getpid()}")
        with open(probe, "w", encoding="utf-8"):
            pass
        os.remove(probe)
    except OSError as error:
        raise CollectionError(f"cannot write to the output folder {output_dir}: {error.strerror or error}") from None


def pending(files: Sequence[AudioFile], output_dir: str, formats: Sequence[str]) -> List[AudioFile]:
    """The files that lack one of their outputs (what a run transcribes; the rest it skips)."""
    return [audio for audio in files if _skipped(audio, output_dir, formats) is None]


# A run reads the durations its containers state (no decoding) for an ETA by audio time, up to
# this many files; beyond it the ETA counts files (reading them all would delay the start).
MAX_PROBED = 5000


def audio_duration(path: str) -> Optional[float]:
    """The duration in seconds that a file's container states (read without decoding), or
    None where it states none or the file cannot be opened."""
    import av

    try:
        with av.open(path, metadata_errors="ignore") as container:
            if container.duration is not None and container.duration > 0:
                return container.duration / av.time_base
            stream = next(iter(container.streams.audio), None)
            if stream is not None and stream.duration and stream.time_base:
                return float(stream.duration * stream.time_base)
    except Exception:  # any file PyAV cannot read: its transcription will say why
        return None
    return None


def _skipping_done(files: Sequence[AudioFile], output_dir: str, formats: Sequence[str]):
    """Yield the "skipped" result of each file whose outputs all exist; return the others, in
    order (one look at each file's outputs: a list lookup per file was quadratic)."""
    todo: List[AudioFile] = []
    for audio in files:
        skipped = _skipped(audio, output_dir, formats)
        if skipped is None:
            todo.append(audio)
        else:
            yield skipped
    return todo


def _skipped(audio: AudioFile, output_dir: str, formats: Sequence[str]) -> Optional[FileResult]:
    """``audio``'s result when all its outputs exist (it is skipped), else None."""
    outputs = output_paths(output_dir, audio.stem, formats)
    return FileResult(audio.path, "skipped", outputs) if all(os.path.isfile(path) for path in outputs) else None


def usable_cores() -> int:
    """The CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def default_layout(
    files: int, jobs: Optional[int] = None, threads: Optional[int] = None, cores: Optional[int] = None
) -> Tuple[int, int]:
    """(jobs, threads per job) for ``files`` files on ``cores`` cores (default: ``usable_cores``),
    filling in what is not given: one job per core with one thread each, no more jobs than
    files, the cores left over given to the jobs' threads. On 2 cores two jobs of one thread
    transcribed a folder of real speech faster than one job of two (the figures:
    docs/measurements.md, "Whole collections"): a small model's decoder step does not use a
    second core well, and two encoders on a core each beat one on both."""
    cores = cores or usable_cores()
    if jobs is None:
        jobs = max(1, min(files, cores // (threads or 1)))
    return jobs, threads or max(1, cores // jobs)


# Files one process transcribes at once where its model batches (``files_in_flight``): each has
# a window in flight, so concurrent ``generate()`` calls can share one call in the worker
# (``stock.batching``). The figure by measurement on 2 cores: docs/measurements.md, "Batching".
# Each file in flight holds its decoded audio (faster-whisper decodes a whole file: ~230 MB of
# float32 for an hour).
FILES_IN_FLIGHT = 16


def files_in_flight(model, jobs: int) -> int:
    """Files transcribed at once by default: ``FILES_IN_FLIGHT`` where ``model``'s worker
    batches ``generate()`` calls, else ``jobs`` (one per replica, as before batching)."""
    engines = getattr(getattr(model, "model", None), "engines", None)
    stock = getattr(engines, "stock", None)
    batches = stock is not None and stock.max_batch_rows > 1
    return max(jobs, FILES_IN_FLIGHT) if batches else jobs


def transcribe_files(
    inputs: Sequence[str],
    output_dir: str,
    formats: Sequence[str] = ("txt",),
    model=None,
    jobs: int = 1,
    in_flight: Optional[int] = None,
    **transcribe_options,
) -> Iterator[FileResult]:
    """Transcribe every audio file ``inputs`` name (``find_audio``) into ``output_dir``.

    Args:
        inputs: audio files, folders (searched recursively) and text files listing paths.
        output_dir: where the outputs go (made if needed).
        formats: output formats (``outputs.WRITERS``: txt, srt, vtt, json).
        model: a ``FlashWhisperModel`` (or faster-whisper's ``WhisperModel``); default
            ``FlashWhisperModel("tiny.en", num_workers=jobs)``, built only if a file needs
            transcribing.
        jobs: the model's replicas (its ``num_workers``: ``generate()`` calls run at once).
        in_flight: files transcribed at once, threads sharing the model (default
            ``files_in_flight``: 16 where the model batches, else ``jobs``).
        transcribe_options: ``transcribe()``'s options (``beam_size=1`` unless given).
    Yields:
        a ``FileResult`` per file as each is finished (in order with one job).
    Raises:
        CollectionError: before anything is transcribed (``find_audio``,
            ``check_output_folder``).
    """
    files = find_audio(inputs)
    check_output_folder(output_dir)
    return transcribe_found(files, output_dir, formats, model, jobs, in_flight, **transcribe_options)


def transcribe_found(
    files: Sequence[AudioFile],
    output_dir: str,
    formats: Sequence[str],
    model=None,
    jobs: int = 1,
    in_flight: Optional[int] = None,
    **transcribe_options,
) -> Iterator[FileResult]:
    """``transcribe_files`` on files already found (``find_audio``), into a checked folder.

    ``in_flight`` files (default ``files_in_flight``) are transcribed at once by threads
    sharing ``model``, which should be built with faster-whisper's ``num_workers=jobs``
    (CTranslate2 then runs that many calls at once, each on a replica with ``cpu_threads``
    threads; the worker runs the files' concurrent ``generate()`` calls as one where they can
    share one, each file's output unchanged), the largest started first (``largest_first``);
    results come as files finish. An interruption (Ctrl-C, closing the iterator) lets the files
    being transcribed finish and write their outputs, and starts no other.
    """
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs!r}")
    if in_flight is not None and in_flight < 1:
        raise ValueError(f"in_flight must be >= 1, got {in_flight!r}")
    transcribe_options.setdefault("beam_size", 1)
    todo = yield from _skipping_done(files, output_dir, formats)
    if not todo:
        return
    model = model or _default_model(jobs)
    slots = in_flight or files_in_flight(model, jobs)
    if slots == 1:
        for audio in todo:
            yield _transcribe_one(model, audio, output_dir, formats, transcribe_options)
        return
    with ThreadPoolExecutor(slots, thread_name_prefix="ct2-flash-transcribe") as pool:
        running: Set[Future] = set()
        try:
            for audio in largest_first(todo):
                running.add(pool.submit(_transcribe_one, model, audio, output_dir, formats, transcribe_options))
                if len(running) >= slots:
                    finished, running = wait(running, return_when=FIRST_COMPLETED)
                    for future in finished:
                        yield future.result()
            while running:
                finished, running = wait(running, return_when=FIRST_COMPLETED)
                for future in finished:
                    yield future.result()
        finally:
            for future in running:
                future.cancel()  # not started yet: never started; running ones finish whole


def largest_first(files: Sequence[AudioFile]) -> List[AudioFile]:
    """``files`` in the order to start them when several are in flight: the largest on disk
    first (a stand-in for the longest, known without opening them; ties keep their order). A
    recording's windows are decoded one after another, each after the last; started first, they
    run beside the short files, whose windows batch, rather than alone at the end."""

    def size(audio: AudioFile) -> int:
        try:
            return os.path.getsize(audio.path)
        except OSError:  # its transcription will say why
            return 0

    return sorted(files, key=size, reverse=True)


def _default_model(jobs: int):
    from ct2_flash.adapter.whisper_model import FlashWhisperModel

    return FlashWhisperModel("tiny.en", num_workers=jobs, cpu_threads=default_layout(jobs, jobs)[1])


def _transcribe_one(model, audio: AudioFile, output_dir: str, formats: Sequence[str], options: dict) -> FileResult:
    started = time.perf_counter()
    try:
        segments, info = model.transcribe(audio.path, **options)
        segments = list(segments)
    except (ValueError, OSError) as error:  # AudioError and PyAV's errors; one bad file stops nothing
        return FileResult(audio.path, "failed", error=_reason(error), seconds=time.perf_counter() - started)
    written = write_outputs(segments, info, audio.path, output_dir, formats, stem=audio.stem)
    return FileResult(
        audio.path, "done", written, audio_seconds=float(info.duration), seconds=time.perf_counter() - started
    )


def _reason(error: BaseException) -> str:
    """One line naming what went wrong (the error's type, unless its message names it)."""
    lines = str(error).strip().splitlines()
    text = lines[0] if lines else ""
    name = type(error).__name__
    return text if name in text else f"{name}: {text}".rstrip(": ")


# --- On a cluster: Ray Data, one model per actor -------------------------------------------

RAY_HINT = "pip install 'ct2-flash[ray]' (or bash scripts/install.sh --ray)"


def transcribe_on_ray(
    files: Sequence[AudioFile],
    output_dir: str,
    formats: Sequence[str],
    model_options: Dict,
    address: Optional[str] = None,
    actors: Optional[int] = None,
    **transcribe_options,
) -> Iterator[FileResult]:
    """``transcribe_found`` as a Ray Data job: the files left to do go to a pool of actors, each
    holding one ``FlashWhisperModel(**model_options)`` and writing its files' outputs into
    ``output_dir`` (a path every node sees) as ``transcribe_found`` does: whole or not at all, a
    failure a result with its reason. Files whose outputs exist are skipped here, on the driver.
    An actor transcribes the files of a Ray batch at once (up to ``FILES_IN_FLIGHT``, threads
    sharing its model, where the model batches), so its worker runs their ``generate()`` calls
    as one where they can share one, as ``transcribe_found`` does.

    Args:
        address: the cluster (``ray.init(address=...)``); None starts a local Ray instance,
            or uses the one this process already started.
        actors: the most actors (default: the cluster's CPUs over ``model_options``'
            ``cpu_threads``); each reserves ``cpu_threads`` CPUs.
    Yields:
        a ``FileResult`` per file as it finishes (skipped ones first).
    Raises:
        CollectionError: Ray is not installed, or the cluster does not answer.
    """
    try:
        import ray
    except ImportError:
        raise CollectionError(f"--ray needs Ray, which is not installed: {RAY_HINT}") from None
    todo = yield from _skipping_done(files, output_dir, formats)
    if not todo:
        return
    if not ray.is_initialized():
        if address not in (None, "", "auto", "local"):
            _check_reachable(address)
        try:
            ray.init(address=address, log_to_driver=False, include_dashboard=False, logging_level=logging.WARNING)
        except Exception as error:  # Ray raises ConnectionError, RuntimeError, ValueError... by case
            raise CollectionError(f"cannot start or reach Ray at {address or 'a local instance'}: {error}") from None
    threads = max(1, int(model_options.get("cpu_threads") or 1))
    if actors is None:
        actors = max(1, min(len(todo), int(ray.cluster_resources().get("CPU", 1)) // threads))
    transcribe_options.setdefault("beam_size", 1)
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False  # the caller shows its own progress
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    dataset = ray.data.from_items([{"path": audio.path, "stem": audio.stem} for audio in todo])
    per_actor = max(1, min(FILES_IN_FLIGHT, -(-len(todo) // actors)))
    results = dataset.map_batches(
        _RayTranscriber,
        batch_size=per_actor,
        concurrency=(1, actors),
        num_cpus=threads,
        fn_constructor_kwargs=dict(
            output_dir=output_dir, formats=list(formats), model_options=model_options, options=transcribe_options
        ),
    )
    for row in results.iter_rows():
        yield FileResult(
            row["path"],
            row["status"],
            list(row["outputs"]),
            row["error"] or None,
            float(row["audio_seconds"]),
            float(row["seconds"]),
        )


# Seconds a Ray address gets to accept a connection before it counts as not answering (Ray's
# own client retries for minutes).
RAY_CONNECT_TIMEOUT = 10


def _check_reachable(address: str) -> None:
    """Raise ``CollectionError`` unless something accepts a TCP connection at ``address``
    (``host:port`` or ``ray://host:port``)."""
    import socket

    target = address.split("://", 1)[-1]
    host, _, port = target.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=RAY_CONNECT_TIMEOUT):
            return
    except ValueError:
        raise CollectionError(f"not a Ray address (HOST:PORT or ray://HOST:PORT): {address!r}") from None
    except OSError as error:
        raise CollectionError(f"the Ray cluster at {address} does not answer: {error.strerror or error}") from None


class _RayTranscriber:
    """A Ray Data actor: one model, the files of a batch transcribed at once where it batches
    (``files_in_flight``), else one at a time (``_transcribe_one``)."""

    def __init__(self, output_dir: str, formats: List[str], model_options: Dict, options: Dict) -> None:
        from ct2_flash.adapter.whisper_model import FlashWhisperModel

        self.model = FlashWhisperModel(**model_options)
        self.output_dir, self.formats, self.options = output_dir, formats, options

    def __call__(self, batch: Dict) -> Dict[str, list]:
        columns: Dict[str, list] = {
            key: [] for key in ("path", "status", "outputs", "error", "audio_seconds", "seconds")
        }
        files = [AudioFile(str(path), str(stem)) for path, stem in zip(batch["path"], batch["stem"])]
        slots = min(len(files), files_in_flight(self.model, 1))
        with ThreadPoolExecutor(max(1, slots), thread_name_prefix="ct2-flash-ray") as pool:
            done = list(pool.map(lambda audio: self._one(audio), files))
        for result in done:
            columns["path"].append(result.path)
            columns["status"].append(result.status)
            columns["outputs"].append(list(result.outputs))
            columns["error"].append(result.error or "")
            columns["audio_seconds"].append(result.audio_seconds)
            columns["seconds"].append(result.seconds)
        return columns

    def _one(self, audio: AudioFile) -> FileResult:
        return _transcribe_one(self.model, audio, self.output_dir, self.formats, self.options)
