"""Fuzzed exactness (bounded): random transcribe() options and drafters, float32, against
faster-whisper on the committed clips (``ct2_flash/validation/fuzzing.py``; the long run is
``bench/fuzz_exactness.py``)."""

import numpy as np
import pytest

from ct2_flash import FlashWhisperModel
from ct2_flash.drafting.reference import OracleDrafter, RandomDrafter
from ct2_flash.validation.fuzzing import NOT_SPECULATIVE, random_case, run_case

from .conftest import THREADS

FAST_CASES, SLOW_CASES = 10, 200  # the fast tier's share, and the slow tier's bounded run
SHORT = 6.0  # seconds: the bounded run uses the three shortest clips (the long run uses all)


@pytest.fixture(scope="module")
def flash(model_path):
    """A model of its own: the session's shared one logs each fallback reason once, which
    other tests check."""
    return FlashWhisperModel(model_path, stock_engine=False, compute_type="float32", cpu_threads=THREADS)


@pytest.fixture(scope="module")
def drafters(flash):
    return {
        "shipped": flash.decoder.drafter,
        "oracle": OracleDrafter(flash.reference_model, error_rate=0.25, seed=1),
        "random": RandomDrafter(51864, seed=2),
    }


@pytest.mark.parametrize("cases", [FAST_CASES, pytest.param(SLOW_CASES, marks=pytest.mark.slow)])
def test_random_options_and_drafters_give_faster_whispers_segments(flash, float32_pair, clips, drafters, cases):
    audio = {name: samples for name, samples in clips.items() if samples.size / 16000 < SHORT}
    rng = np.random.default_rng(2026)
    failures, speculative, fallen_back = [], 0, 0
    for _ in range(cases):
        case = random_case(rng, sorted(audio))
        result = run_case(case, flash, float32_pair.baseline, audio, drafters)
        if not result["identical"]:
            failures.append(case)
        defaults = {"repetition_penalty": 1, "no_repeat_ngram_size": 0, "beam_size": 1}
        unsupported = any(case["options"].get(name, defaults[name]) != defaults[name] for name in NOT_SPECULATIVE)
        if unsupported:  # left to CTranslate2, and counted as such
            assert result["speculative_rows"] == 0 and result["fallback_calls"] > 0, case
            fallen_back += 1
        else:
            assert result["fallback_calls"] == 0, case
            speculative += result["speculative_rows"] > 0
    assert not failures, failures[:3]
    assert speculative > cases // 2 and fallen_back > 0
