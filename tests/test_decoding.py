"""The decode loop's anchor, cache and budget rules, on a fake target with a known script.

The fake target predicts ``SCRIPT[i]`` after the first i generated tokens when they match the
script, and a wrong token otherwise, so every draft outcome is known in advance.
"""

import dataclasses
from typing import List, Optional, Sequence

import numpy as np
import pytest

from ct2_flash.drafting.base import Drafter, DraftWindow, Proposal
from ct2_flash.loop.decoding import SpeculativeDecoder
from ct2_flash.loop.logit_rules import SpecialTokens
from ct2_flash.loop.options import DecodingOptions
from ct2_flash.loop.stats import SpecStats
from ct2_flash.loop.target import PrefillResult

SPECIAL = SpecialTokens(eot=50256, sot=50257, sot_prev=50360, no_speech=50361, no_timestamps=50362, vocab_size=51864)
PROMPT = [SPECIAL.sot, SPECIAL.no_timestamps]
SCRIPT = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, SPECIAL.eot]
WRONG = 999


def one_hot(token: int) -> np.ndarray:
    row = np.zeros(SPECIAL.vocab_size, dtype=np.float32)
    row[token] = 10.0
    return row


class FakeSequence:
    def __init__(self, prompt: List[int], track_positions: bool = False) -> None:
        self.tokens = list(prompt)
        self.prompt_length = len(prompt)
        self.verify_log: List[tuple] = []  # (cache length before, tokens fed)
        self.track_positions = track_positions
        self.attention_peaks = None  # a fake alignment: row j reads frame 10 x its position

    @property
    def length(self) -> int:
        return len(self.tokens)

    def predict(self) -> int:
        generated = self.tokens[self.prompt_length :]
        if len(generated) < len(SCRIPT) and generated == SCRIPT[: len(generated)]:
            return SCRIPT[len(generated)]
        return WRONG

    def verify(self, tokens: Sequence[int]) -> np.ndarray:
        self.verify_log.append((self.length, list(tokens)))
        if self.track_positions:
            self.attention_peaks = 10 * (self.length + np.arange(len(tokens)))
        rows = []
        for token in tokens:
            self.tokens.append(token)
            rows.append(one_hot(self.predict()))
        return np.stack(rows)

    def rollback(self, length: int) -> None:
        assert 1 <= length <= self.length
        del self.tokens[length:]


class FakeRuntime:
    special = SPECIAL
    suppress_ids = ()
    suppress_ids_begin = ()

    def __init__(self) -> None:
        self.sequence: Optional[FakeSequence] = None
        self.tracking_positions = False

    def track_positions(self, enabled: bool) -> None:
        self.tracking_positions = enabled

    def start(self, encoder_output, prompt):
        self.sequence = FakeSequence(list(prompt), self.tracking_positions)
        return PrefillResult(self.sequence, one_hot(0), one_hot(SCRIPT[0]))

    def no_speech_prob(self, sot_logits) -> float:
        return 0.0

    def decoder_states(self, logits: np.ndarray) -> np.ndarray:
        return self.states_from_columns(self.state_columns(logits))

    def state_columns(self, logits: np.ndarray) -> np.ndarray:
        return logits[:, :4].copy()

    def states_from_columns(self, columns: np.ndarray) -> np.ndarray:
        return columns


class ScriptDrafter(Drafter):
    """Proposes the script, with chosen positions made wrong; records what it was asked."""

    needs_states = True

    def __init__(self, wrong_at: Sequence[int] = ()) -> None:
        self.wrong_at = set(wrong_at)
        self.requests: List[tuple] = []
        self.advances: List[tuple] = []

    def begin(self, window: DraftWindow) -> None:
        pass

    def propose(self, generated, num_tokens):
        self.requests.append((len(generated), num_tokens))
        start = len(generated)
        # Tokens past the end of text exercise an end-of-text inside the block.
        source = SCRIPT + [21, 22, 23]
        tokens = [WRONG if start + j in self.wrong_at else t for j, t in enumerate(source[start : start + num_tokens])]
        return Proposal(tokens=tuple(tokens))

    def advance(self, states, cache_length):
        self.advances.append((None if states is None else states.shape, cache_length))


def run(drafter: Drafter, k: int = 4, max_length: int = 448):
    runtime = FakeRuntime()
    stats = SpecStats()
    result = SpeculativeDecoder(runtime, drafter, k, stats).decode(
        np.zeros((1, 4, 4), dtype=np.float32),
        PROMPT,
        DecodingOptions(max_length=max_length, suppress_blank=False, suppress_tokens=()),
    )
    return result, runtime.sequence, stats


def test_all_accepted_with_bonus_and_eot_inside_block():
    drafter = ScriptDrafter()
    result, sequence, stats = run(drafter, k=4)
    assert result.tokens == SCRIPT[:-1]
    # Round 1: anchor 11 at position 2, drafts 12..15 all accepted, bonus 16 -> cache 2+1+4.
    assert sequence.verify_log[0] == (2, [11, 12, 13, 14, 15])
    # The drafter first gets the last prompt position's state, then each round's kept ones.
    assert drafter.advances[0] == ((1, 4), 2)
    assert drafter.advances[1] == ((5, 4), 7)
    # Round 2: anchor 16 at position 7; drafts 17, 18, 19, 20 accepted, bonus EOT ends it.
    assert sequence.verify_log[1] == (7, [16, 17, 18, 19, 20])
    assert len(sequence.verify_log) == 2
    assert stats.target_calls == 3 and stats.emitted == len(SCRIPT)
    assert stats.accepted == stats.proposed == 8


def test_end_of_text_accepted_inside_block_stops_without_bonus():
    drafter = ScriptDrafter()
    result, sequence, stats = run(drafter, k=8)
    # Round 1 accepts 8 drafts (12..19), bonus 20; round 2 proposes [EOT, 21, 22, ...] after
    # anchor 20, EOT is accepted and ends the transcript: no bonus, nothing after it.
    assert sequence.verify_log[1] == (11, [20, SPECIAL.eot, 21, 22, 23])
    assert len(sequence.verify_log) == 2
    assert result.tokens == SCRIPT[:-1]
    assert stats.emitted == len(SCRIPT)


def test_early_mismatch_rolls_back_and_corrects():
    drafter = ScriptDrafter(wrong_at=[2])
    result, sequence, stats = run(drafter, k=4)
    assert result.tokens == SCRIPT[:-1]
    # Draft for position 2 (token 13) is wrong: one draft (12) accepted, 13 is the correction.
    assert sequence.verify_log[0] == (2, [11, 12, WRONG, 14, 15])
    assert drafter.advances[1] == ((2, 4), 4)
    assert sequence.verify_log[1][0] == 4
    # Round 2 (anchor 13) accepts 14..17 and adds bonus 18; round 3 accepts 19, 20 and EOT.
    assert stats.accepted_by_position == [3, 2, 2, 1]
    assert stats.proposed_by_position == [3, 3, 3, 3]


@pytest.mark.parametrize("max_length, expected_steps", [(6, 3), (8, 4), (12, 6), (7, 3)])
def test_budget_caps_proposals_at_remaining_minus_one(max_length, expected_steps):
    drafter = ScriptDrafter()
    result, sequence, stats = run(drafter, k=8, max_length=max_length)
    # CTranslate2: at most min(max_length // 2, max_length - context) steps; context = 1 here.
    assert len(result.tokens) == expected_steps
    for generated_length, asked in drafter.requests:
        remaining = expected_steps - generated_length
        assert asked == min(8, remaining - 1)
    assert stats.emitted == expected_steps


def test_cache_always_one_behind_the_text():
    drafter = ScriptDrafter(wrong_at=[1, 5, 6])
    result, sequence, _ = run(drafter, k=3)
    assert result.tokens == SCRIPT[:-1]
    for (cache_length, _fed), (generated_length, _) in zip(sequence.verify_log, drafter.requests):
        assert cache_length == len(PROMPT) + generated_length - 1


def test_draft_pause_stops_only_when_drafting_is_slower_than_plain_steps():
    from ct2_flash.loop.draft_pause import STEP_OVER_VERIFY, DraftPause

    # Rounds of 10 ms verification, 1 ms bookkeeping: a plain step would cost 0.55 * 10 + 1 ms.
    plain = STEP_OVER_VERIFY * 0.010 + 0.001
    cases = [
        # (drafter seconds per round, tokens per round, rounds, pays)
        (0.005, 4, 3, True),  # 16 ms for 4 tokens beats 6.5 ms per token
        (0.005, 2, 3, False),  # 8 ms per token
        (0.005, 1, 2, True),  # too early to judge
        (0.000, 2, 5, True),  # a free drafter with 2 tokens per round
    ]
    for drafter_seconds, tokens, rounds, pays in cases:
        pause = DraftPause(min_rounds=3)
        for _ in range(rounds):
            pause.record(tokens, drafter_seconds + 0.011, drafter_seconds, 0.010)
        assert pause.pays() is pays, (drafter_seconds, tokens, rounds)
        assert (pause.round_seconds / pause.emitted <= plain) is pays or rounds < 3
    # A measured single-token pass replaces the estimate: at 9 ms per plain step, 16 ms for
    # 2 tokens pays; at 5 ms it does not.
    pause = DraftPause(min_rounds=3)
    for _ in range(3):
        pause.record(2, 0.016, 0.005, 0.010)
    assert pause.pays(step_seconds=0.009) and not pause.pays(step_seconds=0.005)


def test_stopped_drafting_is_probed_again_with_the_plain_steps_states(monkeypatch):
    from ct2_flash.loop import draft_pause

    verdicts = iter([False, True, True, True])  # the first pause says stop, later ones go on
    monkeypatch.setattr(draft_pause.DraftPause, "pays", lambda self, step_seconds=None: next(verdicts))
    monkeypatch.setattr(draft_pause, "RESUME_AFTER_TOKENS", 2)
    drafter, runtime, stats = ScriptDrafter(), FakeRuntime(), SpecStats()
    decoder = SpeculativeDecoder(runtime, drafter, 2, stats, adaptive=True)
    result = decoder.decode(
        np.zeros((1, 4, 4), dtype=np.float32), PROMPT, DecodingOptions(suppress_blank=False, suppress_tokens=())
    )
    assert result.tokens == SCRIPT[:-1]
    log = runtime.sequence.verify_log
    # Round 1 drafts 12, 13 (bonus 14) and stops; two plain steps emit 15 and 16; then the
    # drafter gets those two positions' states at once and drafts again from anchor 16.
    assert log[:4] == [(2, [11, 12, 13]), (5, [14]), (6, [15]), (7, [16, 17, 18])]
    assert drafter.advances[:3] == [((1, 4), 2), ((3, 4), 5), ((2, 4), 7)]
    assert stats.windows_drafting_stopped == 1 and stats.drafting_resumed == 1
    assert decoder.step_seconds is not None and decoder.step_seconds > 0  # the plain steps were timed


class FlipSequence(FakeSequence):
    """Multi-token passes get the row at one position slightly wrong (as int8 batch rows can):
    a wrong token wins by 0.1 logits there; single-token passes get it right."""

    def __init__(self, prompt: List[int], flip_at: int) -> None:
        super().__init__(prompt)
        self.flip_at = flip_at

    def verify(self, tokens: Sequence[int]) -> np.ndarray:
        rows = super().verify(tokens)
        for j in range(len(tokens)):
            generated = len(self.tokens) - self.prompt_length - len(tokens) + j + 1
            if len(tokens) > 1 and generated == self.flip_at:
                rows[j][WRONG] = rows[j].max() + 0.1
        return rows


class FlipRuntime(FakeRuntime):
    def start(self, encoder_output, prompt):
        self.sequence = FlipSequence(list(prompt), flip_at=3)
        return PrefillResult(self.sequence, one_hot(0), one_hot(SCRIPT[0]))


@pytest.mark.parametrize("guard", [0.0, 0.5, (0.0, 0.0, 0.5), (0.5, 0.5, 0.0, 0.5)])
def test_guard_decides_close_batch_rows_with_a_single_pass(guard):
    runtime, stats = FlipRuntime(), SpecStats()
    decoder = SpeculativeDecoder(runtime, ScriptDrafter(), 4, stats, guard_margin=guard)
    result = decoder.decode(
        np.zeros((1, 4, 4), dtype=np.float32), PROMPT, DecodingOptions(suppress_blank=False, suppress_tokens=())
    )
    log = runtime.sequence.verify_log
    if np.atleast_1d(guard)[min(2, np.size(guard) - 1)] == 0.0:  # the close, wrong row 2 is taken at face value
        assert WRONG in result.tokens and stats.rows_rechecked == 0
        return
    assert result.tokens == SCRIPT[:-1]
    # Row 2 of the first pass (after 11, 12, 13) is unsure: 12 and 13 are kept, 13 becomes the
    # anchor again and leaves the cache, and a single-token pass decides 14.
    assert log[0] == (2, [11, 12, 13, 14, 15]) and log[1] == (4, [13])
    assert stats.rows_rechecked == 1 and stats.emitted == len(SCRIPT)


def test_guard_margins_are_checked_once():
    runtime, stats = FlipRuntime(), SpecStats()
    with pytest.raises(ValueError, match="guard_margin must be >= 0"):
        SpeculativeDecoder(runtime, ScriptDrafter(), 4, stats, guard_margin=(0.5, -1.0))
    with pytest.raises(ValueError, match="guard_margin must be >= 0"):
        SpeculativeDecoder(runtime, ScriptDrafter(), 4, stats, guard_margin=())
    decoder = SpeculativeDecoder(runtime, ScriptDrafter(), 4, stats, guard_margin=[0.5, 1])
    assert decoder.guard_margin == (0.5, 1.0)


def test_a_drafter_that_wants_the_position_hears_where_the_target_read():
    """After each verification, the drafter gets the attention peak of the row that predicted
    the next anchor; tracking is switched on only for such drafters."""

    class Listening(ScriptDrafter):
        wants_position = True

        def __init__(self):
            super().__init__()
            self.positions = []

        def observe_position(self, frame):
            self.positions.append(frame)

    runtime, drafter = FakeRuntime(), Listening()
    decoder = SpeculativeDecoder(runtime, drafter, 4, SpecStats())
    result = decoder.decode(
        np.zeros((1, 4, 4), dtype=np.float32), PROMPT, DecodingOptions(suppress_blank=False, suppress_tokens=())
    )
    assert result.tokens == SCRIPT[:-1] and runtime.tracking_positions
    log = runtime.sequence.verify_log
    assert len(drafter.positions) >= len(log) - 1
    # The first round verifies 5 tokens from the prompt's end and accepts every draft: the
    # next anchor is predicted by its last row.
    first_length, first_tokens = log[0]
    assert drafter.positions[0] == 10 * (first_length + len(first_tokens) - 1)
    plain = SpeculativeDecoder(runtime, ScriptDrafter(), 4, SpecStats())
    plain.decode(
        np.zeros((1, 4, 4), dtype=np.float32), PROMPT, DecodingOptions(suppress_blank=False, suppress_tokens=())
    )
    assert not runtime.tracking_positions


@pytest.mark.parametrize("prefixes", [False, True])
def test_adaptive_rounds_ask_prefix_drafters_for_the_rows_the_draft_lengths_choose(monkeypatch, prefixes):
    """Only a drafter whose short proposals are prefixes of long ones (and cheaper) is asked for
    fewer than K; the others compute their K rows whatever the draft lengths would choose."""
    from ct2_flash.loop import draft_pause
    from ct2_flash.loop.draft_lengths import DraftLengths

    monkeypatch.setattr(draft_pause.DraftPause, "pays", lambda self, step_seconds=None: True)
    monkeypatch.setattr(DraftLengths, "rows", lambda self, limit: min(limit, 2))
    drafter = ScriptDrafter(wrong_at=range(2, 20, 2))
    drafter.proposes_prefixes = prefixes
    decoder = SpeculativeDecoder(FakeRuntime(), drafter, 6, SpecStats(), adaptive=True)
    result = decoder.decode(
        np.zeros((1, 4, 4), dtype=np.float32), PROMPT, DecodingOptions(suppress_blank=False, suppress_tokens=())
    )
    assert result.tokens == SCRIPT[:-1]
    asked = {n for _, n in drafter.requests}
    assert asked == ({2} if prefixes else {6})
    assert decoder.lengths.proposal.timed and decoder.stats.drafted_rows == sum(n for _, n in drafter.requests)


class OfferingDrafter(ScriptDrafter):
    """Offers the rest of the script for free (wrong at chosen positions); proposes nothing."""

    def __init__(self, wrong_at: Sequence[int] = ()) -> None:
        super().__init__()
        self.offers: List[tuple] = []
        self.wrong_offered = set(wrong_at)

    def offered(self, generated, limit):
        self.offers.append((len(generated), limit))
        start = len(generated)
        return tuple(
            WRONG if start + j in self.wrong_offered else t for j, t in enumerate(SCRIPT[start : start + limit])
        )

    def propose(self, generated, num_tokens):
        self.requests.append((len(generated), num_tokens))
        return Proposal(tokens=())


@pytest.mark.parametrize("max_length", [448, 12])
def test_offered_tokens_are_verified_as_one_block_longer_than_k(max_length):
    drafter = OfferingDrafter(wrong_at=[6])
    result, sequence, stats = run(drafter, k=2, max_length=max_length)
    steps = min(max_length // 2, max_length - 1)
    assert result.tokens == SCRIPT[: min(len(SCRIPT) - 1, steps)]
    # Round 1 verifies the anchor and all the script offers (the budget keeps one for the
    # bonus), K = 2 notwithstanding; the wrong 7th token is corrected.
    first_limit = min(32, steps - 2)
    assert drafter.offers[0] == (1, first_limit)
    offered = [WRONG if j == 6 else t for j, t in enumerate(SCRIPT[: 1 + first_limit])][1:]
    assert sequence.verify_log[0] == (2, [11, *offered])
    assert len(offered) == min(len(SCRIPT) - 1, first_limit) > 2
    assert stats.offered_rounds == len(drafter.offers) and stats.offered_accepted == stats.accepted
    # What ended each offered round: the wrong word (a text mismatch), else the whole block.
    assert sum(stats.offered_ends.values()) == stats.offered_rounds
    assert stats.offered_ends.get("text", 0) == int(max_length == 448) and "timestamp" not in stats.offered_ends
    assert drafter.requests == []  # the drafter proposed nothing: its offers covered every round
    # 448: the correction 17 is the next anchor, and 18 .. end of text are offered and kept;
    # 12: the budget ends with the first block's bonus.
    assert len(sequence.verify_log) == (2 if max_length == 448 else 1)


def test_the_counters_former_names_still_read_and_write_with_a_warning():
    """``spec_stats`` fields users may read kept their old names for one release."""
    stats = SpecStats(rows_in_loop=3, rows_in_generate=2, unchanged_calls=1)
    for old, new in (
        ("generate_calls", "rows_in_loop"),
        ("generate_rows", "rows_in_generate"),
        ("fallback_calls", "unchanged_calls"),
    ):
        with pytest.warns(DeprecationWarning, match=f"SpecStats.{old} is now SpecStats.{new}"):
            assert getattr(stats, old) == getattr(stats, new)
        with pytest.warns(DeprecationWarning):
            setattr(stats, old, 7)
        assert getattr(stats, new) == 7
    assert "generate_calls" not in dataclasses.asdict(stats)
