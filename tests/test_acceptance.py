"""Table-driven tests of greedy acceptance (vLLM's rejection-sampler test style)."""

import math

import numpy as np
import pytest

from ct2_flash.loop.acceptance import GreedyRule, greedy_accept, sample_accept
from ct2_flash.loop.drafts import Draft
from ct2_flash.loop.guard import Guard
from ct2_flash.loop.logit_rules import LogitRules, SpecialTokens, draw

EOT = 50256


@pytest.mark.parametrize(
    "name, drafts, target_rows, accepted, next_token, rows_read",
    [
        ("perfect match, bonus", [5, 6, 7], [5, 6, 7, 8], 3, 8, 4),
        ("early mismatch", [5, 9, 7], [5, 6, 7, 8], 1, 6, 2),
        ("first token wrong", [9, 6, 7], [5, 6, 7, 8], 0, 5, 1),
        ("empty draft is a plain step", [], [5], 0, 5, 1),
        ("end-of-text accepted ends without bonus", [5, EOT, 7], [5, EOT, 1, 2], 2, None, 2),
        ("end-of-text as correction", [5, 6], [5, EOT, 3], 1, EOT, 2),
        ("end-of-text as bonus", [5, 6], [5, 6, EOT], 2, EOT, 3),
    ],
)
def test_greedy_accept(name, drafts, target_rows, accepted, next_token, rows_read):
    read = []

    def target_token(row):
        read.append(row)
        return target_rows[row]

    outcome = greedy_accept(drafts, target_token, EOT)
    assert (outcome.accepted, outcome.next_token) == (accepted, next_token), name
    # Rows are read in order and never past the first mismatch.
    assert read == list(range(rows_read)), name
    assert outcome.emitted == accepted + (next_token is not None)


# --- speculative sampling: the output is distributed as the target's own sampling -------------

VOCAB = 6
SAMPLING_EOT = 5
FALSE_ALARM_Z = 3.09  # one-sided normal quantile of 1e-3: each check fails by chance 1 in 1000


def chi_square_critical(df: int) -> float:
    """The chi-square quantile at 1 - 1e-3 (Wilson-Hilferty; within 1% for df >= 3)."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + FALSE_ALARM_Z * math.sqrt(a)) ** 3


def assert_distributed_as(counts: np.ndarray, expected: np.ndarray) -> None:
    """Pearson's chi-square test of ``counts`` against probabilities ``expected``."""
    n = counts.sum()
    cells = expected > 0
    assert counts[~cells].sum() == 0, "a token the target never samples was emitted"
    statistic = float((((counts - n * expected) ** 2)[cells] / (n * expected[cells])).sum())
    assert statistic < chi_square_critical(int(cells.sum()) - 1), (statistic, counts, expected)


def target(prefix) -> np.ndarray:
    """A scripted target: the next-token distribution depends on the previous token."""
    table = np.array(
        [
            [0.40, 0.25, 0.15, 0.10, 0.05, 0.05],
            [0.05, 0.05, 0.60, 0.10, 0.10, 0.10],
            [0.30, 0.00, 0.30, 0.00, 0.20, 0.20],
            [0.10, 0.20, 0.30, 0.25, 0.15, 0.00],
            [0.00, 0.50, 0.00, 0.50, 0.00, 0.00],
            [1 / 6] * 6,
        ]
    )  # after end-of-text: drafts may run on, nothing is kept
    return table[prefix[-1] if prefix else 0]


DRAFTERS = {
    # name -> (distribution given the prefix, or None for a proposal made outright, fixed token)
    "same as the target": lambda prefix: target(prefix),
    "far from the target": lambda prefix: np.array([0.02, 0.02, 0.02, 0.02, 0.9, 0.02]),
    "no mass where the target has some": lambda prefix: np.array([0.0, 0.0, 0.0, 0.5, 0.5, 0.0]),
    "proposed outright": None,
}


def sample_prefix(drafter, length: int, k: int, rng: np.random.Generator) -> tuple:
    """Run the loop (propose k, verify, accept) until ``length`` tokens are out; the first ones."""
    out: list = []
    while len(out) < length and (not out or out[-1] != SAMPLING_EOT):
        drafts, rows = [], []
        for _ in range(k):
            prefix = out + drafts
            if drafter is None:
                drafts.append(int(np.argmax(target(prefix))) if prefix else 3)  # a fixed, often wrong guess
                rows.append(None)
            else:
                q = drafter(prefix)
                drafts.append(draw(q, rng.random()))
                rows.append(q)
        outcome = sample_accept(
            drafts,
            lambda j, out=out, drafts=drafts: target(out + drafts[:j]),
            lambda j, rows=rows: rows[j],
            lambda j: tuple(rng.random(2)),
            SAMPLING_EOT,
        )
        out += drafts[: outcome.accepted] + ([outcome.next_token] if outcome.next_token is not None else [])
    return tuple(out[:length])


@pytest.mark.parametrize("name", list(DRAFTERS))
def test_speculative_sampling_matches_the_target_in_distribution(name):
    """First-token and two-token joint distributions of the loop equal the target's (chi-square,
    fixed seed, false-alarm rate 1e-3 per check), whatever the drafter proposes."""
    rng = np.random.default_rng(11)
    draws = 6000
    first = np.zeros(VOCAB)
    joint = np.zeros((VOCAB, VOCAB))
    for i in range(draws):
        tokens = sample_prefix(DRAFTERS[name], 2, k=1 + i % 3, rng=rng)
        first[tokens[0]] += 1
        if len(tokens) == 2:
            joint[tokens] += 1
    assert_distributed_as(first, target([]))
    expected = target([])[:, None] * np.stack([target([a]) for a in range(VOCAB)])
    expected[SAMPLING_EOT] = 0.0  # nothing follows end-of-text
    assert_distributed_as(joint.ravel(), expected.ravel() / expected.sum())


def test_rejection_draws_from_the_residual_and_draw_follows_weights():
    rng = np.random.default_rng(0)
    p = np.array([0.5, 0.5, 0.0, 0.0, 0.0, 0.0])
    # q puts all its mass on the draft (token 0), p only half: kept half of the time, and when
    # rejected the recovered token comes from max(0, p - q), which is all on token 1.
    q = np.array([1.0, 0, 0, 0, 0, 0])
    outcomes = [
        sample_accept([0], lambda j: p, lambda j: q, lambda j: tuple(rng.random(2)), SAMPLING_EOT) for _ in range(400)
    ]
    rejected = [o.next_token for o in outcomes if o.accepted == 0]
    assert set(rejected) == {1} and 150 < len(rejected) < 250
    counts = np.bincount([draw(np.array([0.0, 3.0, 1.0, 0.0]), rng.random()) for _ in range(8000)], minlength=4)
    assert_distributed_as(counts.astype(float), np.array([0.0, 0.75, 0.25, 0.0]))
    # An accepted end-of-text ends the block with no bonus token.
    eot_sure = np.eye(VOCAB)[SAMPLING_EOT]
    for rows in (lambda j: eot_sure, lambda j: None):
        outcome = sample_accept(
            [SAMPLING_EOT, 1], lambda j: eot_sure, rows, lambda j: tuple(rng.random(2)), SAMPLING_EOT
        )
        assert (outcome.accepted, outcome.next_token) == (1, None)


def test_with_drafts_proposed_outright_the_output_is_plain_sampling_with_the_same_uniforms():
    """Whatever is drafted, each emitted token is the one the target alone would draw with the
    same per-position uniforms: a seeded run repeats across drafters and draft lengths."""
    rng = np.random.default_rng(5)
    for _ in range(300):
        fixed = rng.random((8, 2))
        plain = []
        for position in range(4):
            plain.append(draw(target(plain), fixed[position][1]))
            if plain[-1] == SAMPLING_EOT:
                break
        out = []
        while len(out) < len(plain) and (not out or out[-1] != SAMPLING_EOT):
            drafts = [int(t) for t in rng.integers(0, VOCAB, size=int(rng.integers(0, 4)))]
            start = len(out)
            outcome = sample_accept(
                drafts,
                lambda j, out=out, drafts=drafts: target(out + drafts[:j]),
                lambda j: None,
                lambda j, fixed=fixed, start=start: tuple(fixed[start + j]),
                SAMPLING_EOT,
            )
            out += drafts[: outcome.accepted] + ([outcome.next_token] if outcome.next_token is not None else [])
        assert out[: len(plain)] == plain


# The guard's margins on synthetic rows: every decision a row makes under the logit rules (the
# best text token against the next, the best timestamp against the next, the timestamp mass
# against the best text token) is measured, and a row closer than the threshold is unsure.
_SPECIAL = SpecialTokens(eot=50256, sot=50257, sot_prev=50360, no_speech=50361, no_timestamps=50362, vocab_size=51864)
_TS = _SPECIAL.timestamp_begin
_FLOOR = -30.0  # low enough that the 1,501 timestamp columns add no mass


def _rows(first: dict, bonus: int) -> np.ndarray:
    """[2, vocab]: row 0 with the given logits over the floor; row 1 a clear ``bonus``."""
    rows = np.full((2, _SPECIAL.vocab_size), _FLOOR, dtype=np.float32)
    for token, value in first.items():
        rows[0, token] = value
    rows[1, bonus] = 10.0
    return rows


def _mass_at(text_best: float, gap: float) -> dict:
    """Two timestamps whose log-sum-exp is ``text_best + gap`` (and the text token)."""
    each = text_best + gap - np.log(2.0)
    return {300: text_best, _TS + 5: each, _TS + 6: each}


@pytest.mark.parametrize(
    "name, timestamps, first, draft, unsure, margin",
    [
        ("close text tokens", False, {300: 5.0, 301: 4.9}, 300, True, 0.1),
        ("clear text token", False, {300: 5.0, 301: 1.0}, 300, False, 4.0),
        ("close timestamps", True, {_TS + 5: 8.0, _TS + 6: 7.95, 300: 1.0}, _TS + 5, True, 0.05),
        ("clear timestamp", True, {_TS + 5: 8.0, _TS + 6: 4.0, 300: 1.0}, _TS + 5, False, 4.0),
        # The timestamp mass just under the best text token: text wins, by 0.01.
        ("timestamp mass at the edge, below", True, _mass_at(5.0, -0.01), 300, True, 0.01),
        # Just over it: text is ruled out, by 0.01, although the timestamps' own top-2 gap is 0.
        ("timestamp mass at the edge, above", True, _mass_at(5.0, 0.01), _TS + 5, True, 0.0),
        ("timestamp mass far below", True, _mass_at(5.0, -3.0), 300, False, 3.0),
        ("a NaN logit cannot be judged", False, {300: 5.0, 301: np.nan}, 300, True, None),
    ],
)
def test_guard_margins_cover_every_decision_of_a_row(name, timestamps, first, draft, unsure, margin):
    rules = LogitRules(
        special=_SPECIAL,
        suppress_ids=(),
        suppress_begin_ids=(),
        timestamps=timestamps,
        max_initial_timestamp_id=_TS + 50,
        sample_begin=0,
    )
    # After a timestamp and a word: the mass rule applies, timestamps after <|0.00|> are allowed.
    generated = [_TS, 290] if timestamps else [290]
    # After a lone timestamp only a later one may follow: the bonus row's clear choice.
    bonus = _TS + 9 if draft >= _TS else 400
    choice = rules.choose_block(_rows(first, bonus), generated, [draft])
    if margin is None:
        assert np.isnan(choice.margins(1)[0]), name
    else:
        assert choice.margins(1)[0] == pytest.approx(margin, abs=1e-4), name
    outcome = GreedyRule(Guard(np.array([2.0])), _SPECIAL.eot).accept(Draft(tokens=(draft,)), choice, 0)
    assert outcome.unsure is unsure, name
    # Unsure: nothing of the row is kept and no token is guessed (a single pass decides it).
    assert (outcome.accepted, outcome.next_token) == ((0, None) if unsure else (1, bonus)), name
