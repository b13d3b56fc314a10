"""What several subcommands share."""

from __future__ import annotations

import sys


def read_audio(path: str):
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


def parse_decoder_threads(value: str):
    """--decoder-threads: "auto", "none" or a thread count -> ``FlashWhisperModel(decoder_threads=...)``."""
    if value in ("auto", "none"):
        return None if value == "none" else value
    try:
        return int(value)
    except ValueError:
        raise SystemExit(f"--decoder-threads takes an int, 'auto' or 'none', not {value!r}") from None
