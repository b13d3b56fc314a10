"""A user's own recordings as teacher-extraction input: found, split by file, cut into windows.

``ct2-flash adapt`` learns from audio it has no transcripts for: the target labels it. This
module turns the files and folders a user names into the data directory ``extract`` reads
(``manifest.jsonl`` + ``audio/<id>.npy``, 16 kHz int16), one entry per window:

- **Found**: a file named on the command line is taken whatever its extension (PyAV decides
  whether it reads); a folder is searched recursively for the extensions ``ct2-flash bench``
  reads. A path that does not exist is an error before any work (a typo should not silently
  shrink the data).
- **Split by file**, never by window: every window of one recording is on the same side, so
  the held-out measurement never sees a recording the drafter learned from. Which files are
  held out is a stable hash of their paths.
- **Cut** as faster-whisper decodes them: a recording of up to 30 s is one window; a longer
  one goes through faster-whisper's Silero VAD, and its speech is packed into windows of at
  most 30 s (the batched pipeline's chunks). A recording with no speech, no samples, or less
  than ``MIN_SECONDS`` is skipped with its reason.

Each finished file is recorded in ``sources.jsonl`` (after its windows are written), so a run
killed in the middle resumes at the file it was on.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import asdict, dataclass
from typing import Dict, Iterable, List, Sequence, Tuple

import numpy as np

from ct2_flash.benchmark.manifest import AUDIO_EXTENSIONS

logger = logging.getLogger("ct2_flash")

SAMPLING_RATE = 16000
WINDOW_SECONDS = 30.0
# Shorter than this holds no token (Whisper's timestamps are 20 ms apart; one short word is
# ~0.2 s).
MIN_SECONDS = 0.2
SOURCES_FILE = "sources.jsonl"
MANIFEST_FILE = "manifest.jsonl"


@dataclass(frozen=True)
class Source:
    """What became of one input file.

    Attributes:
        path: the file.
        split: "train" or "validation" (held out).
        windows: windows written (0 when skipped).
        seconds: audio in those windows.
        skipped: why nothing was written ("" when something was).
    """

    path: str
    split: str
    windows: int = 0
    seconds: float = 0.0
    skipped: str = ""


def find_audio(paths: Sequence[str]) -> Tuple[List[str], List[Source]]:
    """The audio files under ``paths`` (sorted, each once) and the folders that held none.

    Raises:
        FileNotFoundError: a path does not exist.
    """
    files: List[str] = []
    empty: List[Source] = []
    for path in paths:
        if os.path.isfile(path):
            files.append(os.path.abspath(path))
        elif os.path.isdir(path):
            found = [
                os.path.abspath(os.path.join(root, name))
                for root, _, names in os.walk(path)
                for name in names
                if os.path.splitext(name)[1].lower() in AUDIO_EXTENSIONS
            ]
            if not found:
                logger.warning("ct2-flash adapt: %s holds no audio files (%s)", path, " ".join(AUDIO_EXTENSIONS))
                empty.append(Source(path=os.path.abspath(path), split="", skipped="folder without audio files"))
            files.extend(found)
        else:
            raise FileNotFoundError(f"{path} does not exist")
    return sorted(dict.fromkeys(files)), empty


def split_by_file(files: Sequence[str], holdout: float) -> Dict[str, str]:
    """file -> "train" or "validation": ``round(holdout * n)`` files held out (at least one,
    never all), chosen by a stable hash of their paths.

    Raises:
        ValueError: fewer than two files, or ``holdout`` outside (0, 1).
    """
    if not 0.0 < holdout < 1.0:
        raise ValueError(f"--holdout must be between 0 and 1 (a fraction of the files), not {holdout}")
    if len(files) < 2:
        raise ValueError(
            f"adaptation holds out whole recordings to measure on, so it needs at least two audio "
            f"files; found {len(files)}"
        )
    held = min(len(files) - 1, max(1, round(holdout * len(files))))
    by_hash = sorted(files, key=lambda path: hashlib.sha1(path.encode("utf-8")).hexdigest())
    chosen = set(by_hash[:held])
    return {path: "validation" if path in chosen else "train" for path in files}


def speech_windows(audio: np.ndarray, vad_options=None) -> List[np.ndarray]:
    """[samples] float32 at 16 kHz -> the windows the target decodes, each <= 30 s.

    Up to 30 s: the recording itself, if the VAD hears speech in it. Longer: its speech
    (faster-whisper's ``get_speech_timestamps``) packed into windows of at most 30 s.
    """
    from faster_whisper.vad import VadOptions, collect_chunks, get_speech_timestamps

    if audio.size < MIN_SECONDS * SAMPLING_RATE:
        return []
    options = vad_options or VadOptions(max_speech_duration_s=WINDOW_SECONDS, min_silence_duration_ms=160)
    speech = get_speech_timestamps(audio, options)
    if not speech:
        return []
    if audio.size <= WINDOW_SECONDS * SAMPLING_RATE:
        return [audio]
    chunks, _ = collect_chunks(audio, speech, SAMPLING_RATE, WINDOW_SECONDS)
    return [chunk for chunk in chunks if chunk.size >= MIN_SECONDS * SAMPLING_RATE]


def done_sources(data_dir: str) -> Dict[str, Source]:
    """The files a previous run finished (by path)."""
    path = os.path.join(data_dir, SOURCES_FILE)
    if not os.path.isfile(path):
        return {}
    sources = {}
    with open(path, encoding="utf-8") as stream:
        for line in stream:
            if line.endswith("\n"):  # the last line of a killed run may be cut short
                source = Source(**json.loads(line))
                sources[source.path] = source
    return sources


def prepare(data_dir: str, split: Dict[str, str], progress: bool = True, copies: int = 0) -> List[Source]:
    """Write the windows of every file in ``split`` not done yet; returns every file's outcome
    (in ``split``'s order), done before or now.

    ``copies``: each training window is also written this many times at another speed
    (``speed_copies``); held-out windows never are.

    Unreadable files are skipped with their reason; a full disk raises (``OSError``) after
    removing the window it was writing, and the file is done again on resume.
    """
    from tqdm import tqdm

    from ct2_flash.adapter.audio import AudioError, checked_audio

    audio_dir = os.path.join(data_dir, "audio")
    os.makedirs(audio_dir, exist_ok=True)
    done = done_sources(data_dir)
    manifest_path = os.path.join(data_dir, MANIFEST_FILE)
    for log_path in (manifest_path, os.path.join(data_dir, SOURCES_FILE)):
        _drop_partial_line(log_path)
    written = set()  # windows of a file the last run was killed on after writing them
    if os.path.isfile(manifest_path):
        with open(manifest_path, encoding="utf-8") as stream:
            written = {json.loads(line)["id"] for line in stream}
    order = list(split)
    index_of = {path: index for index, path in enumerate(order)}  # a file's number in its windows' ids
    pending = [path for path in order if path not in done]
    with (
        open(manifest_path, "a", encoding="utf-8") as manifest,
        open(os.path.join(data_dir, SOURCES_FILE), "a", encoding="utf-8") as log,
        tqdm(total=len(pending), desc="audio", unit="file", disable=not progress) as bar,
    ):
        for path in pending:
            try:
                audio = checked_audio(path, SAMPLING_RATE)
            except (AudioError, OSError) as error:
                source = Source(path=path, split=split[path], skipped=f"unreadable: {error}")
            else:
                source = _write_file(audio_dir, manifest, written, path, index_of[path], split[path], audio, copies)
            if source.skipped:
                logger.warning("ct2-flash adapt: skipped %s: %s", path, source.skipped)
            log.write(json.dumps(asdict(source)) + "\n")
            log.flush()
            done[path] = source
            bar.update(1)
    return [done[path] for path in order]


def _write_file(audio_dir, manifest, written, path, index, split, audio, copies) -> Source:
    """Write one file's windows (and a training file's speed copies) to ``audio_dir`` and
    their entries to ``manifest``, leaving out the ids in ``written``; returns its outcome."""
    windows = speech_windows(audio)
    entries = [
        _write_window(audio_dir, f"f{index:05d}w{number:03d}", window, path, split)
        for number, window in enumerate(windows)
    ]
    if split == "train":
        entries += [
            _write_window(audio_dir, f"f{index:05d}w{number:03d}c{copy + 1}", faster, path, "train")
            for number, window in enumerate(windows)
            for copy, faster in enumerate(speed_copies(window, copies, f"{index}/{number}"))
        ]
    for entry in (e for e in entries if e["id"] not in written):
        manifest.write(json.dumps(entry) + "\n")
    manifest.flush()
    return Source(
        path=path,
        split=split,
        windows=len(windows),
        seconds=round(sum(w.size for w in windows) / SAMPLING_RATE, 3),
        skipped="" if windows else _no_windows_reason(audio),
    )


def _no_windows_reason(audio: np.ndarray) -> str:
    """Why a readable file gave no window to train on."""
    if audio.size == 0:
        return "empty"
    if audio.size < MIN_SECONDS * SAMPLING_RATE:
        return f"shorter than {MIN_SECONDS} s"
    return "no speech found by the VAD"


# Speed factors of the copies: the range of speed perturbation in speech recognition training
# (tempo and pitch together), never within 3% of the original.
SPEEDS = (0.9, 1.1)


def speed_copies(window: np.ndarray, copies: int, key: str) -> List[np.ndarray]:
    """``copies`` versions of ``window`` at speeds drawn (stably, by ``key``) from ``SPEEDS``,
    each cut to 30 s. The target labels them too: more of the user's speech as the target
    hears it, not a new domain."""
    from ct2_flash.train.augment import _change_speed

    rng = np.random.default_rng(int.from_bytes(hashlib.sha1(key.encode()).digest()[:4], "little"))
    result = []
    for _ in range(copies):
        speed = 1.0
        while abs(speed - 1.0) < 0.03:
            speed = float(rng.uniform(*SPEEDS))
        result.append(_change_speed(window, speed)[: int(WINDOW_SECONDS * SAMPLING_RATE)])
    return result


def _drop_partial_line(path: str) -> None:
    """Cut a line a killed run left unfinished (the next one is appended after it)."""
    if not os.path.isfile(path):
        return
    with open(path, "rb+") as stream:
        data = stream.read()
        if data and not data.endswith(b"\n"):
            stream.truncate(data.rfind(b"\n") + 1)


def _write_window(audio_dir: str, window_id: str, window: np.ndarray, path: str, split: str) -> dict:
    """Save one window as int16 (atomically: a killed run leaves no half file) -> its manifest entry."""
    target = os.path.join(audio_dir, f"{window_id}.npy")
    partial = target + ".partial.npy"
    try:
        # faster-whisper's decode_audio gives int16 samples / 32768, so this is lossless and
        # extract's / 32768 gives back the very waveform a decode reads (a 32767 scale
        # flipped a near-tie in a test clip's teacher tokens).
        np.save(partial, np.clip(np.round(window * 32768.0), -32768, 32767).astype(np.int16))
        os.replace(partial, target)
    except OSError:
        if os.path.exists(partial):
            os.remove(partial)
        raise
    return {
        "id": window_id,
        "split": split,
        "voice": path,
        "text": "",
        "seconds": round(window.size / SAMPLING_RATE, 3),
    }


def summarize(sources: Iterable[Source]) -> Dict[str, object]:
    """Counts for the report: files, windows and minutes per split, and every skipped file."""
    sources = list(sources)
    summary: Dict[str, object] = {}
    for split in ("train", "validation"):
        used = [s for s in sources if s.split == split and not s.skipped]
        summary[split] = {
            "files": len(used),
            "windows": sum(s.windows for s in used),
            "minutes": round(sum(s.seconds for s in used) / 60, 2),
        }
    summary["skipped"] = [{"path": s.path, "reason": s.skipped} for s in sources if s.skipped]
    return summary


def usable(sources: Iterable[Source], split: str) -> int:
    """Windows of ``split`` that were written."""
    return sum(s.windows for s in sources if s.split == split and not s.skipped)
