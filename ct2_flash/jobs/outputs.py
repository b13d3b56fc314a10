"""Transcript files from faster-whisper segments: txt, srt, vtt and json, as
``whisper-ctranslate2`` and OpenAI's ``whisper`` command write them."""

from __future__ import annotations

import json
import os
from typing import Callable, Dict, List, Optional, Sequence

FORMATS = ("txt", "srt", "vtt", "json")


def timestamp(seconds: float, decimal: str) -> str:
    """HH:MM:SS<decimal>mmm (SubRip uses ",", WebVTT ".")."""
    milliseconds = int(round(max(seconds, 0.0) * 1000))
    hours, milliseconds = divmod(milliseconds, 3_600_000)
    minutes, milliseconds = divmod(milliseconds, 60_000)
    seconds_part, milliseconds = divmod(milliseconds, 1000)
    return f"{hours:02d}:{minutes:02d}:{seconds_part:02d}{decimal}{milliseconds:03d}"


def to_txt(segments: Sequence, info) -> str:
    return "".join(segment.text.strip() + "\n" for segment in segments)


def to_srt(segments: Sequence, info) -> str:
    blocks = [
        f"{i}\n{timestamp(s.start, ',')} --> {timestamp(s.end, ',')}\n{s.text.strip()}\n"
        for i, s in enumerate(segments, start=1)
    ]
    return "\n".join(blocks)


def to_vtt(segments: Sequence, info) -> str:
    blocks = [f"{timestamp(s.start, '.')} --> {timestamp(s.end, '.')}\n{s.text.strip()}\n" for s in segments]
    return "WEBVTT\n\n" + "\n".join(blocks)


def to_json(segments: Sequence, info) -> str:
    def words(segment) -> List[dict]:
        return [
            {"start": w.start, "end": w.end, "word": w.word, "probability": w.probability} for w in segment.words or ()
        ]

    document = {
        "text": "".join(s.text for s in segments).strip(),
        "language": info.language,
        "duration": info.duration,
        "segments": [
            {
                "id": s.id,
                "start": s.start,
                "end": s.end,
                "text": s.text,
                "tokens": list(s.tokens),
                "avg_logprob": s.avg_logprob,
                "compression_ratio": s.compression_ratio,
                "no_speech_prob": s.no_speech_prob,
                "temperature": s.temperature,
                **({"words": words(s)} if s.words else {}),
            }
            for s in segments
        ],
    }
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


WRITERS: Dict[str, Callable] = {"txt": to_txt, "srt": to_srt, "vtt": to_vtt, "json": to_json}


def output_paths(output_dir: str, stem: str, formats: Sequence[str]) -> List[str]:
    """``<output_dir>/<stem>.<format>`` for each format (``stem`` may hold sub-folders, "/"-separated)."""
    return [os.path.join(output_dir, *stem.split("/")[:-1], f"{stem.split('/')[-1]}.{name}") for name in formats]


def write_outputs(
    segments: Sequence, info, audio_path: str, output_dir: str, formats: Sequence[str], stem: Optional[str] = None
) -> List[str]:
    """Write ``<output_dir>/<stem>.<format>`` for each format (``stem``: the audio file's name
    without its extension unless given); returns the paths.

    Each file is written whole or not at all: every format goes to a temporary file beside its
    target first, and only when all are written do they replace their targets, so an
    interrupted run (an error, Ctrl-C, a kill) leaves no half-written output under a real name.
    A temporary file a killed run left beside a target is removed when the target is written.
    """
    stem = stem if stem is not None else os.path.splitext(os.path.basename(audio_path))[0]
    paths = output_paths(output_dir, stem, formats)
    os.makedirs(os.path.dirname(paths[0]) if paths else output_dir, exist_ok=True)
    for path in paths:
        _remove_stale_partials(path)
    written = []
    try:
        for name, path in zip(formats, paths):
            partial = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.partial-{os.getpid()}")
            written.append(partial)
            with open(partial, "w", encoding="utf-8") as stream:
                stream.write(WRITERS[name](segments, info))
        for partial, path in zip(written, paths):
            os.replace(partial, path)
    finally:
        for partial in written:
            if os.path.exists(partial):
                os.remove(partial)
    return paths


def _remove_stale_partials(path: str) -> None:
    """Remove the temporary files beside ``path`` that processes no longer running left
    (``.NAME.partial-PID``; a kill leaves them)."""
    folder, prefix = os.path.dirname(path) or ".", f".{os.path.basename(path)}.partial-"
    try:
        names = [name for name in os.listdir(folder) if name.startswith(prefix)]
    except OSError:
        return
    for name in names:
        pid = name[len(prefix) :]
        if pid.isdigit() and not _running(int(pid)):
            try:
                os.remove(os.path.join(folder, name))
            except OSError:
                pass


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True
