"""The log-softmax of emitted tokens' rows, computed the way CTranslate2's CPU kernel does.

Every verified round scores its emitted tokens by the log-softmax of their rows (CTranslate2's
sequence score), and scores decide faster-whisper's temperature fallback, so they should be
the engine's own numbers, not merely close to exact ones.

CTranslate2's CPU log-softmax (``cpu::softmax`` with ``log``) takes the row maximum, adds
``exp(x - max)`` into one vector accumulator of the ISA's width, lane by lane in column order,
folds the lanes (halves onto halves on x86, pairs on NEON), adds the leftover columns one by
one, and returns ``x - max - log(sum)`` in float32. The sequential float32 accumulation is what
sets it apart from exact arithmetic: in the lane that holds the maximum, thousands of terms
below half a unit in the last place of the running sum are dropped, so the engine's score sits
a few 1e-5 above the exact value, by an amount that depends on the lane width. We compute the
same structure: ONNX Runtime's Exp and an in-order CumSum per lane (``ct2_flash/converters/row_graph.py``
writes the graph), then the fold, the tail and the log here. What is left is the exp kernels'
own rounding (ONNX Runtime's vs CTranslate2's Cephes polynomial), ~1e-7 in a score.

The lane width follows the engine's ISA choice (``engine_isa``, decided once per process):
CTranslate2 dispatches AVX2 on any x86 CPU that has it, AVX-512 ones included (AVX-512 only
when ``CT2_FORCE_CPU_ISA`` asks for it); the first call the loop decodes checks that choice
against one score of the engine's own (``confirm_isa``). ONNX Runtime's own LogSoftmax,
which scored the rows before, sums in an order of its own that also changes with the CPU's
ISA, and was as far from the engine as exact arithmetic on some of them (docs/exactness.md,
"Scores follow the engine's own arithmetic").
"""

from __future__ import annotations

import functools
import logging
import os
import platform
import threading
from typing import Optional

import numpy as np

logger = logging.getLogger("ct2_flash")


# The graph ct2_flash/converters/row_graph.py writes.
GRAPH_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "row_lane_sums.onnx")
# CTranslate2's vector width (float32 lanes) per CPU ISA name, as CT2_FORCE_CPU_ISA spells them.
LANE_WIDTHS = {"GENERIC": 1, "AVX": 8, "AVX2": 8, "AVX512": 16, "NEON": 4}
# A candidate ISA matches the engine when its scores are this close: what is left between them
# is the exp kernels' own rounding (~1e-7); lane widths move a peaked row's score by ~1e-5.
ISA_MATCH = 1e-6
# platform.machine() names of x86 CPUs, lower case.
_X86 = ("x86_64", "amd64", "i386", "i686", "x86")


def isa_of(environ, cpu_flags, machine: str) -> str:
    """The ISA CTranslate2 chooses for its CPU kernels (``cpu_isa.cc``'s ``init_isa``) given
    the environment (``CT2_FORCE_CPU_ISA`` wins), the CPU's feature flags (None: unknown,
    taken as AVX2 on x86) and ``platform.machine()``."""
    forced = environ.get("CT2_FORCE_CPU_ISA", "")
    if forced:
        if forced not in LANE_WIDTHS:
            raise ValueError(
                f"CT2_FORCE_CPU_ISA={forced!r} is not an ISA CTranslate2 knows "
                f"(one of {', '.join(sorted(LANE_WIDTHS))})"
            )
        return forced
    machine = machine.lower()
    if machine in ("aarch64", "arm64"):
        return "NEON"
    if machine not in _X86:
        return "GENERIC"
    if cpu_flags is None or "avx2" in cpu_flags:
        return "AVX2"
    return "AVX" if "avx" in cpu_flags else "GENERIC"


class _Decision:
    """The process's ISA: decided from the CPU once, then checked once against a score the
    engine computed (``confirm_isa``)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.isa: Optional[str] = None
        self.confirmed = False


_decision = _Decision()


def engine_isa() -> str:
    """The ISA this process's CTranslate2 runs its CPU kernels with, decided once: from
    ``isa_of`` at the first call, or what ``confirm_isa`` found the engine computes."""
    if _decision.isa is not None:  # decided: every scored block asks
        return _decision.isa
    with _decision.lock:
        if _decision.isa is None:
            flags = _cpu_flags()
            machine = platform.machine()
            if flags is None and machine.lower() in _X86:
                logger.warning(
                    "ct2-flash: cannot read the CPU's feature flags (no /proc/cpuinfo); scores take "
                    "CTranslate2's AVX2 kernels until one score of the engine's is compared"
                )
            _decision.isa = isa_of(os.environ, flags, machine)
        return _decision.isa


def isa_confirmed() -> bool:
    return _decision.confirmed


def skip_confirmation(reason: str) -> None:
    """Give up the check for this process (it could not be made), keeping the decided ISA."""
    with _decision.lock:
        if _decision.confirmed:
            return
        _decision.confirmed = True
    logger.warning(
        "ct2-flash: could not check the engine's ISA against one of its scores (%s); scores follow %s",
        reason,
        engine_isa(),
    )


def confirm_isa(rows: np.ndarray, columns, engine_scores) -> str:
    """Check ``engine_isa()`` against scores CTranslate2 itself computed, once per process.

    The ISA is derived from the CPU's flags, which is how CTranslate2 dispatches today; a build
    without dispatch, a release that dispatches AVX-512, or a system without ``/proc/cpuinfo``
    would give scores another lane width. Each candidate width scores ``rows`` here; the one
    within ``ISA_MATCH`` of the engine's scores is kept (the decided one where several are, as
    on rows whose sums drop no term). None within: a warning, since the loop's scores will then
    differ from ``generate()``'s by about the difference, and the decided ISA stays.

    Args:
        rows: [r, v] float32 logits as the engine scored them (after the logit rules).
        columns: [r] the tokens it chose.
        engine_scores: [r] its log-probabilities of them.
    Returns:
        The ISA kept.
    """
    decided = engine_isa()
    with _decision.lock:
        if _decision.confirmed:
            return _decision.isa
        _decision.confirmed = True
    engine_scores = np.asarray(engine_scores, dtype=np.float64)
    candidates = ("NEON", "GENERIC") if decided == "NEON" else ("AVX2", "AVX512", "GENERIC")
    distance = {decided: float(np.abs(log_softmax_at(rows, columns, decided) - engine_scores).max())}
    if distance[decided] <= ISA_MATCH:  # the others are not scored: the first scoring in a lane order costs time
        return decided
    for isa in candidates:
        if isa != decided:
            distance[isa] = float(np.abs(log_softmax_at(rows, columns, isa) - engine_scores).max())
    best = min(distance, key=distance.get)
    if distance[best] <= ISA_MATCH:
        logger.warning(
            "ct2-flash: CTranslate2 scores as its %s kernels do, not %s as the CPU's flags suggest; scores follow %s",
            best,
            decided,
            best,
        )
        with _decision.lock:
            _decision.isa = best
        return best
    logger.warning(
        "ct2-flash: no known CTranslate2 kernel gives the engine's scores (closest: %s, %.1e away); the "
        "scores of rows the loop decides may differ from generate()'s by about that much (tokens do "
        "not change)",
        best,
        distance[best],
    )
    return decided


def _cpu_flags():
    """The CPU's feature flags from ``/proc/cpuinfo``; None where it cannot be read."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


@functools.lru_cache(maxsize=None)
def _session():
    # Here: ONNX Runtime loads on the first scored row, not with the package.
    import onnxruntime as ort

    options = ort.SessionOptions()
    # One thread: a few rows are too little work to split, and the engine's threads are busy.
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(GRAPH_FILE, options, providers=["CPUExecutionProvider"])


def fold_lanes(lane_sums: np.ndarray, isa: str) -> np.ndarray:
    """[r, width] float32 -> [r]: the vector accumulator's lanes added as the ISA's horizontal
    sum does (x86: ``reduce_add`` adds the upper half onto the lower one until one lane is
    left; NEON's ``vaddvq_f32`` adds neighbouring pairs)."""
    lanes = np.asarray(lane_sums, dtype=np.float32)
    while lanes.shape[1] > 1:
        if isa == "NEON":
            lanes = lanes[:, 0::2] + lanes[:, 1::2]
        else:
            half = lanes.shape[1] // 2
            lanes = lanes[:, :half] + lanes[:, half:]
    return lanes[:, 0]


def log_softmax_at(rows: np.ndarray, columns, isa=None) -> np.ndarray:
    """[r] float32: ``log_softmax(rows[i])[columns[i]]`` as CTranslate2's CPU kernel computes it.

    Args:
        rows: [r, v] float32 logits, -inf allowed; every row has a finite value; v above the
            lane width.
        columns: [r] column of each row.
        isa: the engine's ISA (default ``engine_isa()``).
    """
    columns = np.asarray(columns, dtype=np.int64).reshape(-1, 1)
    if columns.shape[0] == 0:
        return np.zeros(0, dtype=np.float32)
    isa = engine_isa() if isa is None else isa
    width = LANE_WIDTHS[isa]
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    count, size = rows.shape
    if size <= width:
        raise ValueError(f"rows of {size} columns are no wider than the engine's {width} lanes")
    body = size - size % width
    peaks, lane_sums, tail, picked = _session().run(
        None,
        {
            "rows": rows,
            "columns": columns,
            "body": np.array([body], dtype=np.int64),
            "lane_shape": np.array([count, body // width, width], dtype=np.int64),
        },
    )
    sums = fold_lanes(lane_sums[:, 0, :], isa)
    for column in range(tail.shape[1]):  # the leftover columns, one at a time
        sums = sums + tail[:, column]
    with np.errstate(divide="ignore"):
        offsets = -peaks[:, 0] - np.log(sums)
    return picked[:, 0] + offsets
