"""The log-softmax of emitted tokens' rows, in ONNX Runtime's vectorised kernel.

Every verified round scores its emitted tokens by the log-softmax of their rows (CTranslate2's
sequence score): a pass of exponentials over 51,864 columns per token. Two reasons to run it
in ONNX Runtime rather than numpy:

- **It follows the engine.** CTranslate2's CPU log-softmax uses a vectorised approximate exp
  that sits a few 1e-5 per token from exact arithmetic, always on the same side; this kernel
  lands about ten times closer to CTranslate2's scores than exact arithmetic (numpy, float32
  or float64) does (README "Bookkeeping"; ``test_token_scores_follow_ctranslate2s_own_log_softmax``
  checks it). Scores decide faster-whisper's temperature fallback, so the closer the better.
- **It is cheaper.** numpy's float32 ``exp`` is slow on CPUs without AVX-512, and this pass was
  the largest part of a round's bookkeeping.

The graph is ``ct2_flash/data/row_log_softmax.onnx`` (``converters/row_graph.py`` writes it);
onnxruntime is a faster-whisper dependency already.
"""

from __future__ import annotations

import functools

import numpy as np

from .converters.row_graph import GRAPH_FILE


@functools.lru_cache(maxsize=None)
def _session():
    import onnxruntime as ort

    options = ort.SessionOptions()
    # One thread: a few rows are too little work to split, and the engine's threads are busy.
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(GRAPH_FILE, options, providers=["CPUExecutionProvider"])


def log_softmax_at(rows: np.ndarray, columns) -> np.ndarray:
    """[r] float32: ``log_softmax(rows[i])[columns[i]]``.

    Args:
        rows: [r, v] float32 logits, -inf allowed; every row has a finite value.
        columns: [r] column of each row.
    """
    columns = np.asarray(columns, dtype=np.int64).reshape(-1, 1)
    if columns.shape[0] == 0:
        return np.zeros(0, dtype=np.float32)
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    return _session().run(None, {"rows": rows, "columns": columns})[0][:, 0]
