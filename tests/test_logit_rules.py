"""LogitRules against CTranslate2's own edited logits (generate(return_logits_vocab=True)).

CTranslate2 returns, for every greedy step, the logits after its processors ran, with
disabled tokens set to the lowest float. Replaying the same tokens with single steps gives the
raw logits at float32 (bit for bit, or within 1e-5 after a batched prompt), so the set of disabled tokens must match exactly, for
timestamps on and off, a forced prefix, previous text and the suppression options.
"""

import numpy as np
import pytest

from ct2_flash.loop.options import DecodingOptions

from .test_target import encode, prompts


@pytest.fixture(scope="module")
def windows(float32_pair, clips):
    return [encode(float32_pair.flash, clips[name]) for name in ("clip04_slt.ogg", "clip12_awb.ogg")]


CASES = [
    ("timestamps", {}),
    ("no timestamps", {}),
    ("previous text", {}),
    ("prefix", {}),
    ("timestamps", {"max_initial_timestamp_index": 0}),
    ("timestamps", {"suppress_blank": False, "suppress_tokens": []}),
    ("previous text, no timestamps", {"suppress_tokens": [-1, 13, 11]}),
]


@pytest.mark.parametrize("name, options", CASES)
def test_disabled_tokens_match_ctranslate2(float32_pair, windows, name, options):
    flash = float32_pair.flash
    decoder = flash.decoder
    prompt = prompts(flash)[name]
    greedy = DecodingOptions(
        suppress_tokens=tuple(options.get("suppress_tokens", (-1,))),
        **{k: v for k, v in options.items() if k != "suppress_tokens"},
    )
    rules = decoder.rules_for(prompt, greedy)
    checked = 0
    for window in windows:
        result = flash.reference_model.generate(window, [prompt], beam_size=1, return_logits_vocab=True, **options)[0]
        tokens = list(result.sequences_ids[0])
        ct2_rows = [np.asarray(row) for row in result.logits[0]]
        prefix = rules.sample_begin
        prefill = decoder.runtime.start(window, prompt)
        raw = prefill.next_logits
        for step in range(prefix, len(ct2_rows)):
            edited = raw.copy()
            rules.apply(edited, tokens[:step])
            expected_disabled = ct2_rows[step] < -1e30
            np.testing.assert_array_equal(np.isneginf(edited), expected_disabled, err_msg=f"step {step}")
            enabled = ~expected_disabled
            # Bit-exact without previous text; a batched prompt pass moves values by ~1e-5.
            np.testing.assert_allclose(edited[enabled], ct2_rows[step][enabled], atol=1e-4)
            checked += 1
            if step < len(tokens):
                assert int(np.argmax(edited)) == tokens[step]
                raw = prefill.sequence.verify([tokens[step]])[0]
    assert checked > 20


# The vectorized block rules against the per-row reference.

from ct2_flash.loop.logit_rules import FIRST_ROWS, LogitRules, SpecialTokens  # noqa: E402

SMALL = SpecialTokens(eot=50, sot=51, sot_prev=52, no_speech=53, no_timestamps=54, vocab_size=80)
TS = SMALL.timestamp_begin  # 55 .. 79 are timestamps
# The block scores rows with a vectorised exp, as CTranslate2 does (ct2_flash/loop/row_scores.py):
# up to ~7e-5 from the exact arithmetic of the per-row reference on 51,864-column rows.
SCORE_TOLERANCE = 1e-4


def _reference_rules(rules, logits, generated):
    """Whisper's rules on one row, written plainly after CTranslate2's processors (the
    reference the block form is checked against); returns the timestamp-mass rule's margin."""
    special, step, begin = rules.special, len(generated), rules.sample_begin
    ts_begin, disabled = special.timestamp_begin, np.float32(-np.inf)
    logits[list(rules.suppress_ids)] = disabled
    if step == begin:
        logits[list(rules.suppress_begin_ids)] = disabled
    if not rules.timestamps:
        return np.inf
    logits[special.no_timestamps] = disabled
    check_mass = False
    if step == begin == 0:  # the first token is a timestamp, no later than the maximum
        logits[:ts_begin] = disabled
        logits[rules.max_initial_timestamp_id + 1 :] = disabled
    elif step > begin:
        last = generated[step - 1]
        if last >= ts_begin:
            penultimate = generated[step - 2] if step - 1 > begin else last
            if penultimate >= ts_begin:  # after a pair: text or end
                logits[ts_begin:] = disabled
            else:  # a lone timestamp opens a pair: a later timestamp or end-of-text
                logits[: special.eot] = disabled
                logits[ts_begin:last] = disabled
                check_mass = True
        else:
            check_mass = True
            for token in reversed(generated[begin:step]):  # timestamps never decrease
                if token >= ts_begin:
                    logits[ts_begin : token + 1] = disabled
                    break
    if not check_mass:
        return np.inf
    # The timestamps' mass beats every text token: the next token is a timestamp.
    text = logits[:ts_begin]
    peak = np.max(logits[ts_begin:])
    mass = float(peak + np.log(np.sum(np.exp(logits[ts_begin:] - peak)))) if np.isfinite(peak) else float(peak)
    best_text = float(np.max(text))
    if mass > best_text:
        text[:] = disabled
    return abs(mass - best_text) if np.isfinite(mass - best_text) else np.inf


def _reference_choose(rules, logits, generated):
    """(token, log-probability, margin) of one row by ``_reference_rules``, as ``choose``."""
    margin = _reference_rules(rules, logits, generated)
    token = int(np.argmax(logits))
    best = logits[token]
    logits[token] = -np.inf
    runner_up = np.max(logits)
    logits[token] = best
    margin = min(margin, float(best - runner_up)) if np.isfinite(runner_up) else margin
    peak = np.max(logits)
    return token, float(best - (peak + np.log(np.sum(np.exp(logits - peak))))), margin


def _reference_block(rules, raw, generated, drafts):
    """``_reference_choose`` row by row, on copies."""
    tokens, margins, log_probs, edited = [], [], [], []
    for row in range(raw.shape[0]):
        logits = raw[row].copy()
        token, log_prob, margin = _reference_choose(rules, logits, [*generated, *drafts[:row]])
        tokens.append(token), margins.append(margin), log_probs.append(log_prob), edited.append(logits)
    return np.array(tokens), np.array(margins), np.array(log_probs), np.array(edited)


def _random_sequence(rng, length, begin):
    """Text with timestamp pairs, lone timestamps and forced prefixes mixed in."""
    sequence, stamp = [], TS
    for _ in range(length):
        kind = rng.random()
        if kind < 0.3:
            stamp = min(stamp + int(rng.integers(0, 3)), SMALL.timestamp_end)
            sequence.append(stamp)
        elif kind < 0.35:
            sequence.append(int(rng.integers(TS, SMALL.timestamp_end + 1)))  # may go backwards (a prefix can)
        else:
            sequence.append(int(rng.integers(0, SMALL.eot)))
    return sequence


@pytest.mark.parametrize("seed", range(40))
def test_block_rules_equal_per_row_rules_on_random_rows(seed):
    rng = np.random.default_rng(seed)
    begin = int(rng.integers(0, 3))
    rules = LogitRules(
        special=SMALL,
        suppress_ids=tuple(int(t) for t in rng.choice(SMALL.eot, 5, replace=False)),
        suppress_begin_ids=(7, SMALL.eot),
        timestamps=bool(seed % 4),
        sample_begin=begin,
        max_initial_timestamp_id=TS + int(rng.integers(0, 10)),
    )
    generated = _random_sequence(rng, int(rng.integers(0, 6)), begin)
    drafts = _random_sequence(rng, int(rng.integers(0, 8)), begin)
    raw = rng.normal(0, 3, size=(len(drafts) + 1, SMALL.vocab_size)).astype(np.float32)
    raw[:, TS:] += rng.normal(0, 3)  # sometimes the timestamp mass wins, sometimes not
    tokens, margins, log_probs, edited = _reference_block(rules, raw, generated, drafts)
    block = rules.choose_block(raw.copy(), generated, drafts)
    np.testing.assert_array_equal(block.tokens, tokens)
    np.testing.assert_array_equal(np.isneginf(block.edited), np.isneginf(edited))
    np.testing.assert_array_equal(block.edited, edited)
    np.testing.assert_allclose(block.margins(len(tokens)), margins, rtol=1e-6)
    np.testing.assert_allclose(block.log_probs(block.tokens), log_probs, rtol=0, atol=SCORE_TOLERANCE)


@pytest.mark.parametrize("seed", range(30))
def test_a_block_read_until_its_first_mismatch_chooses_what_the_whole_block_does(seed):
    rng = np.random.default_rng(seed)
    begin = int(rng.integers(0, 3))
    rules = LogitRules(
        special=SMALL,
        suppress_ids=(3, 4),
        suppress_begin_ids=(7, SMALL.eot),
        timestamps=bool(seed % 3),
        sample_begin=begin,
        max_initial_timestamp_id=TS + 5,
    )
    generated = _random_sequence(rng, int(rng.integers(0, 6)), begin)
    raw = rng.normal(0, 3, size=(int(rng.integers(1, 10)), SMALL.vocab_size)).astype(np.float32)
    # Drafts that follow the block's own choices for a while, so that later chunks are read too.
    drafts, whole = [], None
    for row in range(raw.shape[0] - 1):
        whole = rules.choose_block(raw.copy(), generated, drafts + [0] * (raw.shape[0] - 1 - row))
        drafts.append(int(whole.tokens[row]) if rng.random() < 0.8 else int(rng.integers(0, SMALL.vocab_size)))
    whole = rules.choose_block(raw.copy(), generated, drafts)
    logits = raw.copy()
    block = rules.choose_block(logits, generated, drafts, until_mismatch=True)
    read = len(block.tokens)
    np.testing.assert_array_equal(block.tokens, whole.tokens[:read])
    np.testing.assert_array_equal(block.edited, whole.edited[:read])
    np.testing.assert_array_equal(block.rule_margins, whole.rule_margins[:read])
    np.testing.assert_array_equal(logits[read:], raw[read:])  # rows never read stay raw
    # Every row greedy acceptance reads is there: up to the first mismatch or accepted end-of-text.
    needed = next(
        (row + 1 for row, draft in enumerate(drafts) if draft != whole.tokens[row] or draft == SMALL.eot), raw.shape[0]
    )
    assert needed <= read
    assert read == raw.shape[0] or read == FIRST_ROWS  # two chunks: the first rows, then the rest


@pytest.mark.parametrize("name", ["timestamps", "no timestamps", "previous text"])
def test_block_rules_equal_per_row_rules_on_real_rows(float32_pair, windows, name):
    """Blocks of tiny.en's teacher-forced rows along its own greedy output."""
    flash = float32_pair.flash
    decoder = flash.decoder
    prompt = prompts(flash)[name]
    rules = decoder.rules_for(prompt, DecodingOptions())
    blocks = 0
    for window in windows:
        tokens = list(flash.reference_model.generate(window, [prompt], beam_size=1)[0].sequences_ids[0])
        prefill = decoder.runtime.start(window, prompt)
        rows = np.concatenate([prefill.next_logits[None], prefill.sequence.verify(tokens[:-1])])  # row i -> tokens[i]
        for start in range(0, len(tokens) - 1, 3):
            generated, drafts = tokens[:start], tokens[start : start + 7]
            raw = rows[start : start + len(drafts) + 1]
            drafts = drafts[: len(raw) - 1]
            reference = _reference_block(rules, raw, generated, drafts)
            block = rules.choose_block(raw.copy(), generated, drafts)
            np.testing.assert_array_equal(block.tokens, reference[0])
            np.testing.assert_array_equal(block.edited, reference[3])
            np.testing.assert_allclose(block.margins(len(raw)), reference[1], rtol=1e-6)
            np.testing.assert_allclose(block.log_probs(block.tokens), reference[2], rtol=0, atol=SCORE_TOLERANCE)
            blocks += 1
    assert blocks > 10


def test_sampling_distribution_is_the_tempered_softmax_of_the_edited_row_over_the_top_k():
    rng = np.random.default_rng(3)
    rules = LogitRules(
        special=SMALL,
        suppress_ids=(3, 4),
        suppress_begin_ids=(),
        timestamps=True,
        sample_begin=0,
        max_initial_timestamp_id=TS + 5,
    )
    raw = rng.normal(0, 3, size=(2, SMALL.vocab_size)).astype(np.float32)
    block = rules.choose_block(raw, [TS + 1, 9], [11])
    for temperature, topk in ((1.0, 0), (0.5, 0), (2.0, 5)):
        p = block.distribution(1, temperature, topk)
        edited = block.edited[1].astype(np.float64)
        expected = np.where(np.isneginf(edited), 0.0, np.exp((edited - edited.max()) / temperature))
        if topk:
            expected[np.argsort(-edited)[topk:]] = 0.0
        np.testing.assert_allclose(p, expected / expected.sum(), rtol=1e-5, atol=1e-12)
        assert p[3] == p[4] == 0.0  # suppressed tokens are never drawn
    # The score of a drawn token is its log-softmax at temperature 1, whichever token it is.
    token = int(np.flatnonzero(block.distribution(0, 1.0, 0))[0])
    edited = block.edited[0].astype(np.float64)
    expected = edited[token] - np.log(np.sum(np.exp(edited - edited.max()))) - edited.max()
    assert block.log_probs([token])[0] == pytest.approx(expected, abs=SCORE_TOLERANCE)


@pytest.mark.parametrize("seed", range(20))
def test_one_row_choose_and_apply_equal_the_plain_rules(seed):
    """``choose`` and ``apply`` are the block's rules on one row: the same edits, token, margin
    and score as the plain per-row reference."""
    rng = np.random.default_rng(100 + seed)
    begin = int(rng.integers(0, 3))
    rules = LogitRules(
        special=SMALL,
        suppress_ids=(3, 4),
        suppress_begin_ids=(7, SMALL.eot),
        timestamps=bool(seed % 4),
        sample_begin=begin,
        max_initial_timestamp_id=TS + int(rng.integers(0, 10)),
    )
    generated = _random_sequence(rng, int(rng.integers(0, 6)), begin)
    raw = rng.normal(0, 3, size=SMALL.vocab_size).astype(np.float32)
    raw[TS:] += rng.normal(0, 3)
    reference = raw.copy()
    token, log_prob, margin = _reference_choose(rules, reference, generated)
    chosen = raw.copy()
    assert rules.choose(chosen, generated)[0] == token
    np.testing.assert_array_equal(chosen, reference)
    assert rules.choose(raw.copy(), generated)[2] == pytest.approx(margin, rel=1e-6)
    assert rules.choose(raw.copy(), generated)[1] == pytest.approx(log_prob, abs=SCORE_TOLERANCE)
    applied = raw.copy()
    rule_margin = rules.apply(applied, generated)
    expected = raw.copy()
    expected_margin = _reference_rules(rules, expected, generated)
    np.testing.assert_array_equal(applied, expected)
    assert rule_margin == pytest.approx(expected_margin, rel=1e-6)
