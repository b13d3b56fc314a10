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
same structure: ONNX Runtime's Exp and an in-order CumSum per lane (``converters/row_graph.py``
writes the graph), then the fold, the tail and the log here. What is left is the exp kernels'
own rounding (ONNX Runtime's vs CTranslate2's Cephes polynomial), ~1e-7 in a score.

The lane width follows the engine's ISA choice (``engine_isa``): CTranslate2 dispatches AVX2
on any x86 CPU that has it, AVX-512 ones included (AVX-512 only when ``CT2_FORCE_CPU_ISA``
asks for it). ONNX Runtime's own LogSoftmax, which scored the rows before, sums in an order
of its own that also changes with the CPU's ISA: it came within ~5e-7 of the engine on an
AVX2-only EPYC but 2.8e-5 away on an AVX-512 Xeon, as far as exact arithmetic is.
"""

from __future__ import annotations

import functools
import os
import platform

import numpy as np


# The graph converters/row_graph.py writes.
GRAPH_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "row_lane_sums.onnx")
# CTranslate2's vector width (float32 lanes) per CPU ISA name, as CT2_FORCE_CPU_ISA spells them.
LANE_WIDTHS = {"GENERIC": 1, "AVX": 8, "AVX2": 8, "AVX512": 16, "NEON": 4}


def engine_isa(environ=None, cpu_flags=None, machine=None) -> str:
    """The ISA CTranslate2 runs its CPU kernels with (``cpu_isa.cc``'s ``init_isa``).

    Args:
        environ: the environment (default ``os.environ``); ``CT2_FORCE_CPU_ISA`` wins.
        cpu_flags: the CPU's feature flags (default: read from ``/proc/cpuinfo``; None there
            means unknown, taken as AVX2 on x86).
        machine: ``platform.machine()`` by default.
    """
    environ = os.environ if environ is None else environ
    forced = environ.get("CT2_FORCE_CPU_ISA", "")
    if forced:
        if forced not in LANE_WIDTHS:
            raise ValueError(f"CT2_FORCE_CPU_ISA={forced!r} is not an ISA CTranslate2 knows "
                             f"(one of {', '.join(sorted(LANE_WIDTHS))})")
        return forced
    machine = (platform.machine() if machine is None else machine).lower()
    if machine in ("aarch64", "arm64"):
        return "NEON"
    if machine not in ("x86_64", "amd64", "i386", "i686", "x86"):
        return "GENERIC"
    flags = _cpu_flags() if cpu_flags is None else set(cpu_flags)
    if flags is None or "avx2" in flags:
        return "AVX2"
    return "AVX" if "avx" in flags else "GENERIC"


def _cpu_flags():
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
    peaks, lane_sums, tail, picked = _session().run(None, {
        "rows": rows, "columns": columns, "body": np.array([body], dtype=np.int64),
        "lane_shape": np.array([count, body // width, width], dtype=np.int64)})
    sums = fold_lanes(lane_sums[:, 0, :], isa)
    for column in range(tail.shape[1]):  # the leftover columns, one at a time
        sums = sums + tail[:, column]
    with np.errstate(divide="ignore"):
        offsets = -peaks[:, 0] - np.log(sums)
    return picked[:, 0] + offsets
