"""Whether this CPU's stock CTranslate2 decodes a row the same inside a batch as alone.

The worker batches ``generate()`` requests (``batching.py``) only where a row's tokens and
scores do not depend on the other rows of its call. That held on every CPU measured at int8
(``bench/batch_invariance.py``), but it is a property of the kernels a CPU gets (CTranslate2's
tracker reports batch drift with MKL and oneDNN on some), so the worker checks the CPU it runs
on before it first batches: a few rows decoded alone and together, greedy and beam search, the
tokens, scores and no-speech probabilities compared exactly. The verdict is kept in a small
JSON file per machine (the CPU's name and flags, the engine's version, the compute type and
threads), so a machine pays the check (about a second for tiny.en) once.

The rows are the encoder outputs of two synthetic windows (silence, and a fixed pattern), each
given a different text prompt, so that they decode differently and end at different steps.

Loaded by the worker by path: it imports nothing from ct2_flash, nor numpy.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
from typing import Callable, List, Optional

# The decode each row runs (short: the check must be cheap), greedy and beam search.
_CHECKS = ({"beam_size": 1}, {"beam_size": 5})
_MAX_LENGTH = 24
_ROWS = 4


def machine_key(version: str, compute_type: str, threads: int) -> str:
    """This machine's CPU (name and flags, hashed), the engine's version, the compute type and
    threads: what a verdict holds for."""
    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as stream:
            lines = [line for line in stream if line.startswith(("model name", "flags", "Features", "CPU part"))]
            cpu = "".join(sorted(set(lines)))
    except OSError:
        cpu = os.uname().machine
    digest = hashlib.sha1(cpu.encode("utf-8")).hexdigest()[:16]
    return f"{digest}|{version}|{compute_type}|{threads}"


def remembered(path: Optional[str], key: str) -> Optional[bool]:
    """The verdict kept for ``key`` in ``path``, or None."""
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as stream:
            verdict = json.load(stream).get(key)
    except (OSError, ValueError, AttributeError):
        return None
    return verdict if isinstance(verdict, bool) else None


def remember(path: Optional[str], key: str, verdict: bool) -> None:
    """Keep ``verdict`` for ``key`` in ``path`` (written whole, or not at all)."""
    if not path:
        return
    try:
        with open(path, encoding="utf-8") as stream:
            verdicts = json.load(stream)
        if not isinstance(verdicts, dict):
            verdicts = {}
    except (OSError, ValueError):
        verdicts = {}
    verdicts[key] = verdict
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        partial = f"{path}.{os.getpid()}.tmp"
        with open(partial, "w", encoding="utf-8") as stream:
            json.dump(verdicts, stream)
        os.replace(partial, path)
    except OSError:
        pass  # not kept: checked again next time


def batch_invariant(model, storage_view, float32_array: Callable, stacked: Callable, sot: int, prev: Optional[int]):
    """Whether ``model`` (a stock ``ctranslate2.models.Whisper``) gives each of a few rows the
    same results inside one ``generate()`` call as alone.

    Args:
        storage_view: ``ctranslate2.StorageView``.
        float32_array, stacked: ``batching.Float32Array`` and ``batching.stacked``.
        sot, prev: the ids of ``<|startoftranscript|>`` and ``<|startofprev|>`` (None if none).
    """
    frames, mels = 3000, model.n_mels
    outputs = []
    for fill in (_silence, _pattern):
        buffer = (ctypes.c_float * (mels * frames))()
        fill(buffer)
        outputs.append(
            model.encode(storage_view.from_array(float32_array(ctypes.addressof(buffer), (1, mels, frames))))
        )
    rows = [outputs[index % len(outputs)] for index in range(_ROWS)]
    head = [] if prev is None else [prev]
    # Different text before each window: common word pieces of the GPT-2 vocabulary Whisper shares.
    prompts = [head + [1000 + 97 * index, 2000 + 89 * index, 3000 + 83 * index, sot] for index in range(_ROWS)]
    for options in _CHECKS:
        options = dict(options, max_length=_MAX_LENGTH, return_scores=True, return_no_speech_prob=True)
        alone = [_outcome(model.generate(row, [prompt], **options)[0]) for row, prompt in zip(rows, prompts)]
        together = stacked(rows)
        batch = model.generate(storage_view.from_array(together), prompts, **options)
        if [_outcome(result) for result in batch] != alone:
            return False
    return True


def _outcome(result) -> tuple:
    return (result.sequences_ids, result.scores, result.no_speech_prob)


def _silence(buffer) -> None:
    """Log-mel features of silence as faster-whisper computes them: the floor everywhere."""
    for index in range(len(buffer)):
        buffer[index] = -0.5


def _pattern(buffer) -> None:
    """A fixed, speech-like spread of values (no randomness: the same on every machine)."""
    values: List[float] = [((index * 37) % 101) / 50.0 - 1.0 for index in range(997)]
    for index in range(len(buffer)):
        buffer[index] = values[index % 997]
