"""The row log-softmax graph: what it computes, and that the committed file is what its builder writes."""

import numpy as np
import pytest

from ct2_flash.row_scores import log_softmax_at


def test_log_softmax_at_equals_the_exact_value_within_the_kernels_error():
    rng = np.random.default_rng(0)
    rows = rng.normal(0, 4, size=(3, 51864)).astype(np.float32)
    rows[1, ::3] = -np.inf  # disabled tokens, as the logit rules leave them
    columns = np.array([5, 7, 51863])
    exact = rows.astype(np.float64)
    peaks = exact.max(axis=1, keepdims=True)
    exact = (exact - peaks - np.log(np.exp(exact - peaks).sum(axis=1, keepdims=True)))[np.arange(3), columns]
    got = log_softmax_at(rows, columns)
    assert got.shape == (3,) and got.dtype == np.float32
    np.testing.assert_allclose(got, exact, rtol=0, atol=1e-4)
    # Rows need not be contiguous; no rows give an empty result.
    np.testing.assert_array_equal(log_softmax_at(rows[::2], columns[::2]), got[::2])
    assert log_softmax_at(rows[:0], []).shape == (0,)


def test_the_committed_graph_is_what_the_builder_writes():
    onnx = pytest.importorskip("onnx")
    from ct2_flash.converters.row_graph import GRAPH_FILE, build_row_log_softmax

    committed, built = onnx.load(GRAPH_FILE), build_row_log_softmax()
    assert committed.graph == built.graph
    assert list(committed.opset_import) == list(built.opset_import)
