"""The target runtime against CTranslate2 itself: rows, rollback, states, no-speech, scores."""

import numpy as np
import pytest


def encode(model, audio):
    return model.encode_window(audio)


@pytest.fixture(scope="module")
def window(float32_pair, clips):
    return encode(float32_pair.flash, clips["clip08_slt.ogg"])


def prompts(model):
    previous = model.hf_tokenizer.encode(" The boat left at dawn.", add_special_tokens=False).ids
    return {
        "timestamps": [50257],
        "no timestamps": [50257, 50362],
        "previous text": [50360, *previous, 50257],
        "previous text, no timestamps": [50360, *previous, 50257, 50362],
        "prefix": [50257, 50362, *model.hf_tokenizer.encode(" A large", add_special_tokens=False).ids],
        # Task tokens after <|startoftranscript|>, as multilingual prompts have them.
        "task tokens": [50360, *previous, 50257, 50358],
        "task tokens, no timestamps": [50257, 50358, 50362],
    }


def test_verify_rows_match_single_steps_and_rollback(float32_pair, window):
    runtime = float32_pair.flash.decoder.runtime
    tokens = [50363, 317, 1588, 2546, 287, 20262, 318, 1327, 284]
    stepwise = runtime.start(window, [50257])
    step_rows = np.stack([stepwise.sequence.verify([t])[0] for t in tokens])
    batched = runtime.start(window, [50257])
    length = batched.sequence.length
    rows = batched.sequence.verify(tokens)
    assert rows.shape == (len(tokens), 51864)
    np.testing.assert_allclose(rows, step_rows, atol=1e-4)
    # Roll back to the anchor + 2 positions and process a different continuation.
    batched.sequence.rollback(length + 3)
    assert batched.sequence.length == length + 3
    again = batched.sequence.verify(tokens[3:5])
    np.testing.assert_allclose(again, step_rows[3:5], atol=1e-4)
    with pytest.raises(ValueError):
        batched.sequence.rollback(0)


def test_decoder_states_match_exact_solve(float32_pair, window):
    runtime = float32_pair.flash.decoder.runtime
    prefill = runtime.start(window, [50257])
    logits = prefill.sequence.verify([50363, 317, 1588, 2546, 287])
    states = runtime.decoder_states(logits)
    embedding = runtime.embedding().astype(np.float64)
    exact = np.linalg.lstsq(embedding, logits.T.astype(np.float64), rcond=None)[0].T
    assert states.shape == (5, 384)
    relative = np.linalg.norm(states - exact, axis=1) / np.linalg.norm(exact, axis=1)
    assert relative.max() < 1e-3
    # And the recovered states reproduce the logits through the tied embedding.
    np.testing.assert_allclose(states @ embedding.T, logits, atol=1e-2)


@pytest.mark.parametrize(
    "name",
    [
        "timestamps",
        "no timestamps",
        "previous text",
        "previous text, no timestamps",
        "prefix",
        "task tokens",
        "task tokens, no timestamps",
    ],
)
def test_tokens_score_and_no_speech_match_generate(float32_pair, window, name):
    flash = float32_pair.flash
    prompt = prompts(flash)[name]
    options = dict(beam_size=1, return_scores=True, return_no_speech_prob=True, max_initial_timestamp_index=50)
    expected = flash.reference_model.generate(window, [prompt], **options)[0]
    got = flash.model.generate(window, [prompt], **options)[0]
    assert got.sequences_ids == expected.sequences_ids
    assert got.sequences == expected.sequences
    assert abs(got.scores[0] - expected.scores[0]) < 1e-4
    assert abs(got.no_speech_prob - expected.no_speech_prob) < 1e-6


def test_max_length_budget_matches_generate(float32_pair, window):
    flash = float32_pair.flash

    def outcome(generate, prompt, max_length):
        try:
            result = generate(window, [prompt], beam_size=1, max_length=max_length, return_scores=True)[0]
        except ValueError as error:  # CTranslate2 refuses a budget of exactly 0 steps
            return str(error), None
        return result.sequences_ids, result.scores[0]

    for prompt in prompts(flash).values():
        for max_length in (1, 2, 4, 9, 20, 23):
            expected = outcome(flash.reference_model.generate, prompt, max_length)
            got = outcome(flash.model.generate, prompt, max_length)
            assert got[0] == expected[0], (prompt, max_length)
            if expected[1] is not None:
                assert abs(got[1] - expected[1]) < 1e-4, (prompt, max_length)


def test_suppression_options_match_generate(float32_pair, window):
    flash = float32_pair.flash
    for options in (
        dict(suppress_blank=False),
        dict(suppress_tokens=[]),
        dict(suppress_tokens=[-1, 262, 13]),  # also suppress " the" and "."
        dict(max_initial_timestamp_index=0),
        dict(length_penalty=0.5),
    ):
        kwargs = dict(beam_size=1, return_scores=True, **options)
        expected = flash.reference_model.generate(window, [[50257]], **kwargs)[0]
        got = flash.model.generate(window, [[50257]], **kwargs)[0]
        assert got.sequences_ids == expected.sequences_ids, options
        # CTranslate2's vectorised log-softmax is a few 1e-6 off per token, so compare the
        # per-token mean (what length_penalty=1 gives) rather than the raw sum.
        length, penalty = len(got.sequences_ids[0]), options.get("length_penalty", 1.0)
        scale = length**penalty / length
        assert abs(got.scores[0] - expected.scores[0]) * scale < 1e-4, options


def test_token_scores_follow_ctranslate2s_own_log_softmax(float32_pair, window):
    """CTranslate2 scores a step with a float32 log-softmax whose sequential lane sums sit
    ~3e-5 from exact arithmetic; the loop's block scores (``row_scores``, the same order of
    operations) must give the engine's numbers, not the exact ones. Per-token scores of
    ``generate()`` come from cumulative scores at growing lengths (length_penalty 1: score x
    length is the sum)."""
    from ct2_flash.loop.options import DecodingOptions

    flash = float32_pair.flash
    decoder, reference = flash.decoder, flash.reference_model
    prompt = prompts(flash)["no timestamps"]
    tokens = reference.generate(window, [prompt], beam_size=1, max_length=40)[0].sequences_ids[0][:10]
    cumulative = [0.0]
    for steps in range(1, len(tokens) + 1):  # generate() runs min(max_length // 2, max_length - 1) steps
        result = reference.generate(window, [prompt], beam_size=1, max_length=2 * steps, return_scores=True)[0]
        assert result.sequences_ids[0] == tokens[:steps]
        cumulative.append(result.scores[0] * steps)
    engine = np.diff(cumulative)
    prefill = decoder.runtime.start(window, prompt)
    # Single steps, as generate() runs them (a multi-token row moves by up to 5e-5 at float32).
    rows = np.stack([prefill.next_logits, *(prefill.sequence.verify([token])[0] for token in tokens[:-1])])
    block = decoder.rules_for(prompt, DecodingOptions()).choose_block(rows, [], tokens[:-1])
    assert list(block.tokens) == tokens
    ours = block.log_probs(tokens)
    edited = block.edited.astype(np.float64)
    exact = (
        edited[np.arange(len(tokens)), tokens]
        - np.log(np.exp(edited - edited.max(axis=1, keepdims=True)).sum(axis=1))
        - edited.max(axis=1)
    )
    # Measured 2e-7 at most (the exp kernels' own last bits), under AVX2 and GENERIC alike; 4e-7
    # under AVX512 (docs/exactness.md).
    assert np.abs(ours - engine).max() < 2e-6
    assert np.abs(ours - engine).mean() < 0.05 * np.abs(exact - engine).mean()


@pytest.mark.parametrize("prompt_name", ["no timestamps", "previous text", "task tokens"])
def test_the_engine_scores_as_the_decided_isa(float32_pair, window, monkeypatch, caplog, prompt_name):
    """The check the first loop call makes: one generate() score against the loop's, the ISA
    decided from the CPU's flags kept without a warning (on this machine's engine)."""
    from ct2_flash.loop import row_scores

    monkeypatch.setattr(row_scores, "_decision", row_scores._Decision())
    decided = row_scores.engine_isa()
    flash = float32_pair.flash
    flash.decoder.confirm_score_isa(window, prompts(flash)[prompt_name])
    assert row_scores.isa_confirmed() and row_scores.engine_isa() == decided
    assert "ct2-flash" not in caplog.text


def _forcible_isas() -> list:
    """The ISAs this CPU's engine can be forced to besides its own choice: the scalar kernels
    everywhere, the 16-lane AVX-512 ones where the CPU has AVX-512 (CTranslate2 refuses them
    elsewhere, so they are not a test there, rather than a skip)."""
    from ct2_flash.loop import row_scores

    flags = row_scores._cpu_flags() or set()
    return ["GENERIC"] + (["AVX512"] if {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"} <= flags else [])


@pytest.mark.slow
@pytest.mark.parametrize("isa", _forcible_isas())
def test_token_scores_follow_the_engine_under_another_isa(isa):
    """The scores follow the ISA CTranslate2 runs its kernels with, not only the default one:
    the test above, in a process whose engine is forced to ``isa``."""
    import os
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"{os.path.join(here, 'test_target.py')}::test_token_scores_follow_ctranslate2s_own_log_softmax",
        ],
        env=dict(os.environ, CT2_FORCE_CPU_ISA=isa),
        cwd=os.path.dirname(here),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert "1 passed" in completed.stdout


def test_verified_rows_are_the_passes_own_buffer_and_outlive_later_passes(float32_pair, window):
    """``verify`` hands out the engine's output without a copy; the loop edits it in place and
    reads it after the rollback, so later calls must neither reuse nor change it."""
    runtime = float32_pair.flash.decoder.runtime
    sequence = runtime.start(window, [50257]).sequence
    length = sequence.length
    rows = sequence.verify([50363, 317, 1588])
    assert rows.flags.writeable and rows.shape == (3, 51864)
    kept = rows.copy()
    sequence.rollback(length + 1)
    sequence.verify([317, 2546])
    sequence.verify([318])
    np.testing.assert_array_equal(rows, kept)


class _DeviceView:
    """Stands in for a StorageView in GPU memory (no GPU here): what ``host_array`` may call."""

    def __init__(self, values: np.ndarray, dtype) -> None:
        self.values, self.dtype, self.device, self.calls = values, dtype, "cuda", []

    def to(self, dtype):
        self.calls.append(("to", dtype))
        return _DeviceView(self.values.astype(np.float32), dtype)

    def to_device(self, device):
        import ctranslate2

        self.calls.append(("to_device", device))
        return ctranslate2.StorageView.from_array(np.ascontiguousarray(self.values, dtype=np.float32))


def test_host_arrays_view_cpu_buffers_and_copy_gpu_ones():
    """The loop reads logits and encoder outputs through ``host_array``: on the CPU a view of
    the engine's buffer (no copy), from a GPU a float32 copy in host memory."""
    import ctranslate2

    from ct2_flash.loop.target import host_array, on_device_of

    values = np.arange(12, dtype=np.float32).reshape(1, 3, 4)
    cpu = ctranslate2.StorageView.from_array(values)
    assert np.shares_memory(host_array(cpu), values)
    half = _DeviceView(values.astype(np.float16), ctranslate2.DataType.float16)
    copied = host_array(half)
    assert copied.dtype == np.float32 and np.array_equal(copied, values)
    assert [name for name, _ in half.calls] == ["to"]  # float32 on the device, then the host copy
    single = _DeviceView(values, ctranslate2.DataType.float32)
    assert np.array_equal(host_array(single), values) and single.calls == [("to_device", ctranslate2.Device.cpu)]
    row = on_device_of(values[:, :1], cpu)  # a row of a CPU batch stays on the CPU, float32
    assert row.device == "cpu" and np.array_equal(np.asarray(row), values[:, :1])


@pytest.mark.parametrize("start_index", [0, 1, 3, 80, 223])
def test_a_budget_of_n_steps_has_a_max_length(start_index):
    """``max_length_for`` inverts CTranslate2's greedy budget for any prompt length."""
    from ct2_flash.loop.target import PromptLayout

    layout = PromptLayout(sot_index=start_index, start_index=start_index, length=start_index + 1)
    for steps in range(1, 225):
        assert layout.max_steps(layout.max_length_for(steps)) == steps


@pytest.mark.parametrize(
    "case, shape, rank",
    [
        ("tall, full column rank: the normal equations", (64, 16), 16),
        ("wide: the SVD's minimum-norm answer", (16, 64), 16),
        ("tall, rank-deficient: the SVD", (64, 16), 12),
    ],
)
def test_the_pseudo_inverse_is_the_svds(case, shape, rank):
    from ct2_flash.loop.target import pseudo_inverse

    rng = np.random.default_rng(3)
    matrix = rng.standard_normal((shape[0], rank)) @ rng.standard_normal((rank, shape[1]))
    np.testing.assert_allclose(pseudo_inverse(matrix), np.linalg.pinv(matrix), atol=1e-9, err_msg=case)
