"""Which CTranslate2 model the speculative loop drives on CPU: the encoder's own (``cpu_threads``)
or a one-thread copy (``FlashWhisperModel(decoder_threads="auto")``).

The loop makes many small passes from Python. On some CPUs one thread runs them faster than
several, and the encoder keeps all of its threads; on others two threads verify a block much
faster than one, and a fixed split made every speculative call slower (docs/usage.md "Decoder
threads"). Which way wins is the CPU's
business, so "auto" times the pass the loop makes most (anchor plus eight drafts, then the
rollback) on both models and keeps the faster. The tokens are the same either way: int8 logits
are bit-identical at any thread count.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np

from ct2_flash.loop.clock import Stopwatch

# Interleaved timings per model; the first pass of each is a warm-up and not counted.
REPEATS = 6
# Text tokens every Whisper vocabulary has: what they are does not change a pass's cost.
_BLOCK = [400, 401, 402, 403, 404, 405, 406, 407, 408]


@dataclass(frozen=True)
class SplitChoice:
    """The measurement behind "auto": median ms of a 9-row verification and rollback on the
    shared model and on the one-thread copy, and whether the copy was kept."""

    shared_ms: float
    one_thread_ms: float

    @property
    def split(self) -> bool:
        return self.one_thread_ms < self.shared_ms


def _pass(model, state, length: int) -> float:
    with Stopwatch() as watch:
        model.forward_batch(state, _BLOCK)
        state.truncate_to_step(length)
    return watch.seconds


def measure_split(shared, one_thread, d_model: int, frames: int = 1500) -> SplitChoice:
    """Time both models on the loop's typical pass (interleaved, medians), on a zero encoder
    output of ``frames`` x ``d_model`` (the cost does not depend on what the audio says).

    Args:
        shared, one_thread: loaded ``ctranslate2.models.Whisper`` of the same model.
    """
    import ctranslate2

    encoder_output = ctranslate2.StorageView.from_array(np.zeros((1, frames, d_model), dtype=np.float32))
    states = []
    for model in (shared, one_thread):
        state, _ = model.prefill(encoder_output, [_BLOCK[0]])
        states.append((model, state, int(state.current_step)))
    times = ([], [])
    for repeat in range(REPEATS + 1):
        for index, (model, state, length) in enumerate(states):
            seconds = _pass(model, state, length)
            if repeat:
                times[index].append(seconds)
    return SplitChoice(shared_ms=1e3 * statistics.median(times[0]), one_thread_ms=1e3 * statistics.median(times[1]))
