"""Replay a recording as a live stream through ``streaming.OnlineProcessor`` and time it.

As whisper_streaming's simulation does: audio "arrives" at real-time pace from the start of
the replay; each iteration first waits until a whole chunk has arrived since the last one,
inserts all that has arrived (more than a chunk when the previous iteration ran late), and
transcribes. Lag is how far the audio inserted so far is behind the audio that has arrived
when an iteration ends. Without waiting (``wait=False``) every iteration gets exactly one chunk,
as fast as the machine runs, and lag is not defined.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Callable, List, Optional

import numpy as np

from ct2_flash.jobs.streaming import SAMPLE_RATE, OnlineProcessor, Word, text_of


@dataclass(frozen=True)
class Iteration:
    """One ``process_iter`` of a replay.

    Attributes:
        received: seconds of audio inserted so far.
        buffer: seconds in the processor's buffer when it transcribed.
        seconds: wall time of the iteration (insert and transcribe).
        lag: seconds of audio that had arrived but were not yet inserted when it ended (None
            without waiting).
        committed: the text it committed.
    """

    received: float
    buffer: float
    seconds: float
    lag: Optional[float]
    committed: str


def replay(
    processor: OnlineProcessor,
    audio: np.ndarray,
    chunk_seconds: float,
    wait: bool = True,
    on_commit: Optional[Callable[[List[Word]], None]] = None,
) -> List[Iteration]:
    """Feed ``audio`` ([samples] float32, 16 kHz) to ``processor`` as a live stream, then finish it."""
    if not chunk_seconds > 0:
        raise ValueError(f"chunk_seconds must be > 0, got {chunk_seconds!r}")
    chunk = max(1, int(round(chunk_seconds * SAMPLE_RATE)))
    iterations: List[Iteration] = []
    started = time.perf_counter()
    inserted = 0
    while inserted < audio.size:
        if wait:
            # Wait for a whole chunk since the last insert, then take everything that arrived.
            due = started + (inserted + chunk) / SAMPLE_RATE
            time.sleep(max(0.0, due - time.perf_counter()))
            arrived = min(audio.size, int((time.perf_counter() - started) * SAMPLE_RATE))
        else:
            arrived = min(audio.size, inserted + chunk)
        began = time.perf_counter()
        processor.insert_audio(audio[inserted:arrived])
        inserted = arrived
        buffer = processor.buffer_seconds
        committed = processor.process_iter()
        ended = time.perf_counter()
        lag = max(0.0, min(audio.size, (ended - started) * SAMPLE_RATE) - inserted) / SAMPLE_RATE if wait else None
        iterations.append(
            Iteration(
                received=inserted / SAMPLE_RATE,
                buffer=buffer,
                seconds=ended - began,
                lag=lag,
                committed=text_of(committed),
            )
        )
        if committed and on_commit is not None:
            on_commit(committed)
    rest = processor.finish()
    if rest and on_commit is not None:
        on_commit(rest)
    return iterations


def summary(iterations: List[Iteration], audio_seconds: float) -> dict:
    """Mean and p95 seconds per iteration, the real-time factor (processing time over audio
    time) and the final lag."""
    seconds = np.array([it.seconds for it in iterations]) if iterations else np.zeros(1)
    lags = [it.lag for it in iterations if it.lag is not None]
    return {
        "iterations": len(iterations),
        "mean_iteration_seconds": float(seconds.mean()),
        "p95_iteration_seconds": float(np.percentile(seconds, 95)),
        "max_iteration_seconds": float(seconds.max()),
        "real_time_factor": float(seconds.sum() / audio_seconds) if audio_seconds else None,
        "final_lag_seconds": lags[-1] if lags else None,
        "max_lag_seconds": max(lags) if lags else None,
    }


def as_records(iterations: List[Iteration]) -> List[dict]:
    return [asdict(it) for it in iterations]
