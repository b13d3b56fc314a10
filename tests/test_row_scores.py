"""Row scores as CTranslate2's CPU log-softmax computes them: the graph against a plain numpy
reference of the kernel's order of operations, the ISA rule, and the committed graph file.
(``test_target.py`` compares them with the engine's own scores.)"""

import numpy as np
import pytest

from ct2_flash.loop import row_scores
from ct2_flash.loop.row_scores import LANE_WIDTHS, fold_lanes, isa_of, log_softmax_at


def kernel_reference(row: np.ndarray, column: int, isa: str) -> np.float32:
    """CTranslate2's ``cpu::softmax(log=True)`` for one row, written out one float32 operation
    at a time: lane j of the accumulator adds columns j, j + width, ... in order; the lanes are
    folded; the leftover columns are added one by one."""
    width = LANE_WIDTHS[isa]
    peak = row.max()
    terms = np.exp(row - peak)
    body = len(row) - len(row) % width
    lanes = np.zeros(width, dtype=np.float32)
    for start in range(0, body, width):
        lanes = lanes + terms[start : start + width]
    total = fold_lanes(lanes[None], isa)[0]
    for term in terms[body:]:
        total = np.float32(total + term)
    return np.float32(row[column] + np.float32(-peak - np.log(total)))


@pytest.mark.parametrize("isa", ["AVX2", "AVX512", "GENERIC", "NEON"])
def test_scores_follow_the_kernels_order_of_operations(isa):
    rng = np.random.default_rng(0)
    # 51,865 columns (the multilingual vocabulary) leave a tail after the lanes for every width.
    rows = rng.normal(0, 4, size=(3, 51865)).astype(np.float32)
    rows[0, 17] = 30.0  # one dominant token: the sum's rounding is what sets the kernel apart
    rows[1, ::3] = -np.inf  # disabled tokens, as the logit rules leave them
    columns = np.array([17, 7, 51864])
    got = log_softmax_at(rows, columns, isa=isa)
    assert got.shape == (3,) and got.dtype == np.float32
    expected = np.array([kernel_reference(row, column, isa) for row, column in zip(rows, columns)])
    # ONNX Runtime's exp and numpy's differ in the last bit now and then: that, and no more.
    np.testing.assert_allclose(got, expected, rtol=0, atol=2e-6)
    # Rows need not be contiguous; no rows give an empty result.
    np.testing.assert_array_equal(log_softmax_at(rows[::2], columns[::2], isa=isa), got[::2])
    assert log_softmax_at(rows[:0], [], isa=isa).shape == (0,)


def test_lane_widths_change_the_score_as_the_kernel_does():
    """The sequential sum drops terms below the running sum's last place, so the lane width
    moves the score measurably: the test above would not notice a wrong width otherwise."""
    rng = np.random.default_rng(1)
    row = rng.normal(0, 3, size=(1, 51864)).astype(np.float32)
    row[0, 5] = 25.0
    by_isa = {isa: float(log_softmax_at(row, [5], isa=isa)[0]) for isa in ("GENERIC", "AVX2", "AVX512")}
    assert by_isa["GENERIC"] != by_isa["AVX2"] != by_isa["AVX512"]


@pytest.mark.parametrize(
    "environ, flags, machine, isa",
    [
        ({}, {"sse4_1", "avx", "avx2"}, "x86_64", "AVX2"),
        # AVX-512 machines still run the AVX2 kernels unless asked: CTranslate2 does not dispatch AVX-512.
        ({}, {"avx", "avx2", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"}, "x86_64", "AVX2"),
        ({"CT2_FORCE_CPU_ISA": "AVX512"}, {"avx2", "avx512f"}, "x86_64", "AVX512"),
        ({"CT2_FORCE_CPU_ISA": "GENERIC"}, {"avx2"}, "x86_64", "GENERIC"),
        ({}, {"avx"}, "x86_64", "AVX"),
        ({}, {"sse4_1"}, "x86_64", "GENERIC"),
        ({}, None, "x86_64", "AVX2"),
        ({}, set(), "aarch64", "NEON"),
        ({}, set(), "ppc64le", "GENERIC"),
    ],
)
def test_the_isa_follows_ctranslate2s_dispatch(environ, flags, machine, isa):
    assert isa_of(environ, flags, machine) == isa


def test_an_unknown_forced_isa_is_named():
    with pytest.raises(ValueError, match="CT2_FORCE_CPU_ISA='AVX3'"):
        isa_of({"CT2_FORCE_CPU_ISA": "AVX3"}, {"avx2"}, "x86_64")


@pytest.fixture
def fresh_decision(monkeypatch):
    """The process's ISA decision, undecided, for one test."""
    decision = row_scores._Decision()
    monkeypatch.setattr(row_scores, "_decision", decision)
    return decision


def peaked_row() -> np.ndarray:
    rng = np.random.default_rng(1)
    row = rng.normal(0, 3, size=(1, 51864)).astype(np.float32)
    row[0, 5] = 25.0
    return row


def test_the_isa_is_decided_once_per_process(fresh_decision, monkeypatch):
    calls = []
    monkeypatch.setattr(row_scores, "_cpu_flags", lambda: calls.append(1) or {"avx", "avx2"})
    monkeypatch.delenv("CT2_FORCE_CPU_ISA", raising=False)
    assert row_scores.engine_isa() == row_scores.engine_isa() == "AVX2" and len(calls) == 1


def test_no_cpu_flags_on_x86_is_said(fresh_decision, monkeypatch, caplog):
    monkeypatch.setattr(row_scores, "_cpu_flags", lambda: None)
    monkeypatch.setattr(row_scores.platform, "machine", lambda: "AMD64")
    monkeypatch.delenv("CT2_FORCE_CPU_ISA", raising=False)
    assert row_scores.engine_isa() == "AVX2"
    assert "cannot read the CPU's feature flags" in caplog.text


@pytest.mark.parametrize(
    "engine_isa, kept, warning",
    [
        ("AVX2", "AVX2", None),
        ("AVX512", "AVX512", "scores as its AVX512 kernels do, not AVX2"),  # a release that dispatches AVX-512
        ("GENERIC", "GENERIC", "scores as its GENERIC kernels do"),  # a build without dispatch
        (None, "AVX2", "no known CTranslate2 kernel gives the engine's scores"),
    ],
)
def test_the_decided_isa_is_checked_against_a_score_of_the_engines(fresh_decision, caplog, engine_isa, kept, warning):
    fresh_decision.isa = "AVX2"
    row = peaked_row()
    score = log_softmax_at(row, [5], engine_isa)[0] if engine_isa else log_softmax_at(row, [5], "AVX2")[0] + 1e-4
    assert row_scores.confirm_isa(row, [5], [score]) == kept
    assert row_scores.engine_isa() == kept and row_scores.isa_confirmed()
    assert (warning in caplog.text) if warning else not caplog.text
    # Once per process: a later disagreement changes nothing.
    assert row_scores.confirm_isa(row, [5], [score + 1]) == kept


def test_the_committed_graph_is_what_the_builder_writes():
    onnx = pytest.importorskip("onnx")
    from ct2_flash.converters.row_graph import GRAPH_FILE, build_row_lane_sums

    committed, built = onnx.load(GRAPH_FILE), build_row_lane_sums()
    assert committed.graph == built.graph
    assert list(committed.opset_import) == list(built.opset_import)


def test_a_check_that_cannot_be_made_is_given_up_once(fresh_decision, caplog):
    fresh_decision.isa = "AVX2"
    row_scores.skip_confirmation("RuntimeError: no engine")
    row_scores.skip_confirmation("again")
    assert row_scores.isa_confirmed() and row_scores.engine_isa() == "AVX2"
    assert caplog.text.count("could not check the engine's ISA") == 1
