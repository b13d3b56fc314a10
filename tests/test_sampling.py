"""Temperature sampling through the speculative loop: the target's distribution, seeded
repeats, faster-whisper's options and fallback (statistical tests, never speed)."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from ct2_flash import FlashWhisperModel
from ct2_flash.drafting.reference import OracleDrafter, RandomDrafter
from ct2_flash.loop.options import DecodingOptions

from .conftest import THREADS
from .test_acceptance import chi_square_critical

SAMPLED = dict(beam_size=1, sampling_topk=0, sampling_temperature=1.0)


@pytest.fixture(scope="module")
def seeded(model_path):
    return FlashWhisperModel(
        model_path, stock_engine=False, compute_type="float32", cpu_threads=THREADS, adaptive=False, seed=7
    )


def two_sample_statistic(a: Counter, b: Counter) -> tuple:
    """Chi-square statistic of two equal-size samples over categories (those seen fewer than 10
    times in both together are pooled into one), and its degrees of freedom."""
    common = [c for c in set(a) | set(b) if a[c] + b[c] >= 10]
    rest = (sum(a.values()) - sum(a[c] for c in common), sum(b.values()) - sum(b[c] for c in common))
    cells = [(a[c], b[c]) for c in common] + ([rest] if sum(rest) else [])
    statistic = sum((x - y) ** 2 / (x + y) for x, y in cells)
    return statistic, len(cells) - 1


@pytest.mark.parametrize(
    "prompt_name, drafter",
    [
        ("timestamps", "shipped"),
        pytest.param("timestamps", "oracle", marks=pytest.mark.slow),
        pytest.param("no timestamps", "oracle", marks=pytest.mark.slow),
    ],
)
def test_loop_samples_the_first_tokens_as_ctranslate2_does(seeded, clips, prompt_name, drafter):
    """At T = 1, the first three tokens sampled through the loop follow CTranslate2's own
    sampling (two-sample chi-square over 200 draws each, false-alarm rate 1e-3), with drafts
    proposed outright (the oracle: the target's greedy tokens, so drafts are accepted and
    rejected) and drafts drawn from the shipped drafter's own distribution (the rejection
    rule with q)."""
    flash = seeded
    encoder_output = flash.encode_window(clips["clip01_slt.ogg"])
    prompt = [50257] if prompt_name == "timestamps" else [50257, 50362]
    draws = 200
    options = dict(SAMPLED, max_length=len(prompt) + 6)  # 3 steps: min(max_length // 2, max_length - context)
    # One hypothesis per call: CTranslate2 decodes num_hypotheses=200 as a batch of 200 rows
    # over the whole window, slower than 200 single calls; each call samples afresh either way.
    theirs = Counter(
        tuple(flash.reference_model.generate(encoder_output, [prompt], **options)[0].sequences_ids[0][:3])
        for _ in range(draws)
    )
    chosen = OracleDrafter(flash.reference_model) if drafter == "oracle" else flash.decoder.drafter
    flash.reset_spec_stats()
    with flash.use_drafter(chosen):
        ours = Counter(
            tuple(flash.model.generate(encoder_output, [prompt], **options)[0].sequences_ids[0][:3])
            for _ in range(draws)
        )
        stats = flash.spec_stats
    assert stats.draft_rounds > 0 and 0 < stats.acceptance_rate < 1  # drafts were judged both ways
    assert (stats.drawn_rounds > 0) == (drafter == "shipped")  # drafts drawn from q only from the shipped drafter
    for length in (1, 3):
        a = Counter({k[:length]: 0 for k in ours})
        b = Counter({k[:length]: 0 for k in theirs})
        for key, count in ours.items():
            a[key[:length]] += count
        for key, count in theirs.items():
            b[key[:length]] += count
        statistic, df = two_sample_statistic(a, b)
        assert df >= 1 and statistic < chi_square_critical(max(df, 3)), (length, a.most_common(8), b.most_common(8))


def test_seeded_sampling_repeats(model_path, clips):
    """Two models with the same seed and the same drafter give the same samples call for call
    (the oracle, the random drafter, the shipped one proposing outright and drawing from its
    own distribution); another seed gives others.

    Only the same drafter is promised: the uniforms are fixed per output position, so drafts
    proposed outright leave each sample to the target's own draw, but that draw reads a row of
    a multi-token pass, and which rows share a pass depends on the drafter. On CPUs whose
    float32 GEMMs sum in another order for another row count (an AVX-512 Xeon, where the
    oracle and the random drafter sampled apart) a near-tie of the inverse CDF can then go
    either way. Across drafters the samples follow the same distribution
    (``test_loop_samples_the_first_tokens_as_ctranslate2_does``)."""
    audio = clips["clip04_slt.ogg"]
    runs = {}
    cases = (
        (3, "oracle"),
        (3, "oracle"),
        (3, "random"),
        (3, "random"),
        (3, "outright"),
        (3, "outright"),
        (3, "drawn"),
        (3, "drawn"),
        (4, "drawn"),
    )
    for index, (seed, drafter) in enumerate(cases):
        # adaptive (the users' default): a seeded sampled call must not let timings choose its shapes.
        flash = FlashWhisperModel(
            model_path,
            stock_engine=False,
            compute_type="float32",
            cpu_threads=THREADS,
            seed=seed,
            draw_drafts=drafter != "outright",
        )
        encoder_output = flash.encode_window(audio)
        chosen = {
            "oracle": OracleDrafter(flash.reference_model),
            "random": RandomDrafter(51864, seed=1),
            "outright": flash.decoder.drafter,
            "drawn": flash.decoder.drafter,
        }[drafter]
        with flash.use_drafter(chosen, adaptive=True):
            result = flash.model.generate(
                encoder_output,
                [[50257]],
                beam_size=1,
                sampling_topk=0,
                sampling_temperature=1.0,
                num_hypotheses=2,
                return_scores=True,
            )[0]
        runs[index] = (result.sequences_ids, result.scores)
    for first in range(0, 8, 2):
        assert runs[first] == runs[first + 1], cases[first]  # tokens and scores, bit for bit
    assert runs[8][0] != runs[6][0]


def test_best_of_returns_hypotheses_best_score_first(seeded, clips):
    flash = seeded
    encoder_output = flash.encode_window(clips["clip02_awb.ogg"])
    result = flash.model.generate(
        encoder_output,
        [[50257]],
        beam_size=1,
        sampling_topk=0,
        sampling_temperature=0.8,
        num_hypotheses=4,
        return_scores=True,
        return_no_speech_prob=True,
    )[0]
    assert len(result.sequences_ids) == len(result.sequences) == len(result.scores) == 4
    assert result.scores == sorted(result.scores, reverse=True) and all(math.isfinite(s) for s in result.scores)
    reference = flash.reference_model.generate(
        encoder_output, [[50257]], beam_size=1, sampling_topk=0, sampling_temperature=0.8, return_no_speech_prob=True
    )[0]
    assert result.no_speech_prob == pytest.approx(reference.no_speech_prob, abs=1e-6)


def test_transcribe_runs_the_temperature_fallback_through_the_loop(seeded, clips):
    """faster-whisper's fallback retries (temperature > 0, best_of) are speculative calls now."""
    flash = seeded
    flash.reset_spec_stats()
    # A compression-ratio threshold no window passes forces every retry down the list.
    segments, _ = flash.transcribe(
        clips["clip03_rms.ogg"], beam_size=1, temperature=[0.0, 0.5, 1.0], best_of=2, compression_ratio_threshold=0.1
    )
    assert list(segments)
    stats = flash.spec_stats
    assert stats.unchanged_calls == 0 and stats.rows_in_loop >= 1 + 2 * 2


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(sampling_temperature=-0.5, sampling_topk=0), "sampling_temperature"),
        (dict(sampling_temperature=float("nan"), sampling_topk=0), "sampling_temperature"),
        (dict(sampling_temperature=float("inf"), sampling_topk=0), "sampling_temperature"),
        (dict(sampling_topk=-1), "sampling_topk"),
        (dict(num_hypotheses=0, sampling_topk=0), "number of hypotheses"),
        (dict(num_hypotheses=3), "number of hypotheses"),
    ],
)
def test_bad_sampling_options_fail_before_decoding(seeded, clips, options, message):
    flash = seeded
    encoder_output = flash.encode_window(clips["clip02_awb.ogg"])
    calls = flash.spec_stats.target_calls
    with pytest.raises(ValueError, match=message):
        flash.model.generate(encoder_output, [[50257]], beam_size=1, **options)
    assert flash.spec_stats.target_calls == calls
    with pytest.raises(ValueError, match=message):
        DecodingOptions(**options)
