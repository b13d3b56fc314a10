"""A call's decoding options (``loop/options.py``) and the one definition of greedy."""

import math

import pytest

from ct2_flash.loop.options import DecodingOptions, draws_at_random, one_greedy_hypothesis


@pytest.mark.parametrize(
    "topk, temperature, drawn",
    [(1, 1.0, False), (1, 0.7, False), (0, 0.0, False), (5, 0.0, False), (0, 0.7, True), (5, 1.0, True)],
)
def test_only_top_k_other_than_1_at_a_temperature_other_than_0_draws(topk, temperature, drawn):
    assert draws_at_random(topk, temperature) is drawn
    assert DecodingOptions(sampling_topk=topk, sampling_temperature=temperature).sampling is drawn


@pytest.mark.parametrize(
    "options, greedy",
    [
        ({"beam_size": 1}, True),
        ({}, False),  # CTranslate2 defaults to beam_size=5
        ({"beam_size": 1, "num_hypotheses": 2}, False),
        ({"beam_size": 1, "sampling_topk": 0, "sampling_temperature": 0.5}, False),
        ({"beam_size": 1, "sampling_topk": 0, "sampling_temperature": 0.0}, True),
    ],
)
def test_one_greedy_hypothesis(options, greedy):
    assert one_greedy_hypothesis(options) is greedy


@pytest.mark.parametrize(
    "options, message",
    [
        ({"sampling_temperature": -1.0}, "finite number >= 0"),
        ({"sampling_temperature": math.nan}, "finite number >= 0"),
        ({"sampling_topk": -1}, "sampling_topk must be >= 0"),
        ({"num_hypotheses": 0}, "must be > 0"),
        ({"num_hypotheses": 2}, "beam_size \\* patience"),
    ],
)
def test_bad_options_are_refused_once_with_ctranslate2s_words(options, message):
    with pytest.raises(ValueError, match=message):
        DecodingOptions(**options)


def test_the_options_are_those_generate_takes():
    options = DecodingOptions(max_length=100, suppress_tokens=(-1, 11), sampling_topk=0, sampling_temperature=0.5)
    assert options.generate_kwargs() == dict(
        beam_size=1,
        max_length=100,
        suppress_blank=True,
        suppress_tokens=[-1, 11],
        max_initial_timestamp_index=50,
        length_penalty=1.0,
        sampling_topk=0,
        sampling_temperature=0.5,
        num_hypotheses=1,
    )
