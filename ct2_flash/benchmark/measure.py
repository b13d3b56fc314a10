"""Time a faster-whisper model on one input: the whole path and the decode part.

Used by the demo and the benchmark so both systems are measured the same way. The decode part
is the time spent in ``generate()`` (encoder output to last token); the whole path is waveform
to final segments, features, encoder, VAD and word alignment included.

The one module that keeps its own timers (``time.perf_counter``) instead of
``runtime.clock.Stopwatch``: the stock worker loads this file alone, on stock ctranslate2,
where importing ``ct2_flash`` fails by design (``benchmark/stock_worker.py``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, List

import numpy as np


@dataclass(frozen=True)
class Measurement:
    """One transcription of one input.

    Attributes:
        text: the joined segment texts.
        tokens: every segment's tokens, in order.
        segments: (start, end, text) per segment.
        whole_seconds: waveform to segments.
        encode_seconds: time in the encoder.
        decode_seconds: time in ``generate()``.
        temperatures: per segment, the temperature its text was decoded at (above 0: the
            greedy text failed faster-whisper's thresholds and was sampled, so another system
            need not say the same).
        words: (start, end, word) per word with ``word_timestamps=True``, else empty.
    """

    text: str
    tokens: List[List[int]]
    segments: List[tuple]
    whole_seconds: float
    encode_seconds: float
    decode_seconds: float
    temperatures: List[float] = field(default_factory=list)
    words: List[tuple] = field(default_factory=list)


class _Timed:
    """Forwards to a CTranslate2-like model and adds up encode and generate time."""

    def __init__(self, model) -> None:
        self._model = model
        self.encode_seconds = 0.0
        self.generate_seconds = 0.0

    def __getattr__(self, name: str):
        return getattr(self._model, name)

    def encode(self, *args, **kwargs):
        started = time.perf_counter()
        try:
            return self._model.encode(*args, **kwargs)
        finally:
            self.encode_seconds += time.perf_counter() - started

    def generate(self, *args, **kwargs):
        started = time.perf_counter()
        try:
            return self._model.generate(*args, **kwargs)
        finally:
            self.generate_seconds += time.perf_counter() - started


def measure(model, audio: np.ndarray, **transcribe_options: Any) -> Measurement:
    """Transcribe ``audio`` (float32 16 kHz mono) with ``model`` and time it.

    ``model`` is a ``WhisperModel`` or a ``BatchedInferencePipeline`` around one.
    """
    owner = model.model if hasattr(model, "forward") else model  # a pipeline holds the model
    inner = owner.model
    timed = _Timed(inner)
    owner.model = timed
    try:
        started = time.perf_counter()
        segments, _ = model.transcribe(audio, **transcribe_options)
        segments = list(segments)
        whole = time.perf_counter() - started
    finally:
        owner.model = inner
    return Measurement(
        text="".join(segment.text for segment in segments).strip(),
        tokens=[list(segment.tokens) for segment in segments],
        segments=[(segment.start, segment.end, segment.text) for segment in segments],
        whole_seconds=whole,
        encode_seconds=timed.encode_seconds,
        decode_seconds=timed.generate_seconds,
        temperatures=[float(getattr(segment, "temperature", 0.0) or 0.0) for segment in segments],
        words=[(word.start, word.end, word.word) for segment in segments for word in (segment.words or ())],
    )
