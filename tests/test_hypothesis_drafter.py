"""Drafting from the previous hypothesis of the same audio: realignment after a mismatch."""

import numpy as np
import pytest

from ct2_flash.drafting.base import Drafter, DraftWindow, Proposal
from ct2_flash.drafting.hypothesis import LOOP_TOKENS, HypothesisDrafter, ends_in_loop, realign, repeated
from ct2_flash.loop.options import DecodingOptions

TS = 1000  # the first timestamp id in these tables; words are small ids


def ts(seconds):
    return TS + int(round(seconds / 0.02))


EOT = 999
# "<0.0> the cat sat <2.0><2.2> on the mat <4.0>" then end of text.
PREVIOUS = [ts(0.0), 1, 2, 3, ts(2.0), ts(2.2), 4, 1, 5, ts(4.0), EOT]


@pytest.mark.parametrize(
    "case, generated, expected",
    [
        ("the same so far", PREVIOUS[:3], 3),
        ("only the first timestamp", [ts(0.0)], 1),
        ("a segment end moved (2.0 -> 2.4)", [ts(0.0), 1, 2, 3, ts(2.4)], 5),
        ("both boundary timestamps moved", [ts(0.0), 1, 2, 3, ts(2.4), ts(2.6)], 6),
        ("the last word changed, then the text rejoins", [ts(0.0), 1, 2, 7, ts(2.0)], 5),
        ("an inserted word, then the text rejoins", [ts(0.0), 1, 2, 8, 3], 4),
        ("a repeated word placed by its context", [ts(0.0), 1, 2, 3, ts(2.0), ts(2.2), 4, 1], 8),
        ("the previous decode ended here", PREVIOUS[:-1], 10),
        ("the hypothesis ran out: new words after its end", PREVIOUS[:-1] + [9], None),
        ("nothing in common", [ts(0.0), 6, 7], None),
    ],
)
def test_realign(case, generated, expected):
    assert realign(PREVIOUS, generated, TS) == expected, case


def test_a_lone_timestamp_after_other_text_is_placed_only_next_to_where_the_text_should_be():
    """A timestamp after text the previous decode never said matches every boundary."""
    assert realign(PREVIOUS, [ts(0.0), 6, 7, ts(3.0)], TS) == 5  # 4 tokens in: the boundary at 5
    assert realign(PREVIOUS, [ts(0.0), 6, 7, 8, 9, 10, 11, ts(3.0)], TS) is None  # 8 in: none near


def test_among_several_matches_the_one_nearest_the_expected_position_wins():
    previous = [1, 2, 3, 1, 2, 4]
    assert realign(previous, [1, 2], TS) == 2
    assert realign(previous, [1, 2], TS, expected=5) == 5


def test_a_match_on_part_of_the_context_is_taken_only_near_where_the_text_should_be():
    """One common token matches all over a hypothesis: far from the expected position only a
    match on the whole context counts (a false match offers a long block for nothing)."""
    previous = [ts(0.0), 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 1, 16]
    assert realign(previous, [ts(0.0), 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 30, 1], TS) == 17  # near
    assert realign(previous, [ts(0.0), 20, 21, 22, 23, 24, 25, 26, 27, 1], TS) is None  # 1 at 2 or 17: both far
    assert realign(previous, [ts(0.0), 20, 12, 13, 14, 15], TS) == 16  # the whole context: anywhere


def test_a_moved_boundary_is_offered_where_it_moved_to():
    """A segment's end and the next one's start are one timestamp twice: once this decode has
    moved it, the second is offered moved too."""
    previous = [ts(0.0), 1, 2, ts(2.0), ts(2.0), 3, 4, ts(4.0), EOT]
    drafter = HypothesisDrafter(Recording(), TS, EOT)
    drafter.remember(previous)
    drafter.begin(_window())
    assert drafter.offered([ts(0.0)], 8) == (1, 2, ts(2.0), ts(2.0), 3, 4, ts(4.0), EOT)
    # The target chose 2.4 where the block said 2.0: the next block starts with 2.4 too.
    assert drafter.offered([ts(0.0), 1, 2, ts(2.4)], 8) == (ts(2.4), 3, 4, ts(4.0), EOT)
    drafter.begin(_window())  # a new window forgets the moves (and, here, the hypothesis)
    assert drafter.offered([ts(0.0), 1, 2, ts(2.4)], 8) == ()


class Recording(Drafter):
    """Proposes (42,) and records what it was told."""

    def __init__(self):
        self.calls = []

    def begin(self, window):
        self.calls.append("begin")

    def propose(self, generated, num_tokens):
        self.calls.append("propose")
        return Proposal(tokens=(42,))

    def advance(self, states, cache_length):
        self.calls.append(("advance", cache_length))


def _window():
    return DraftWindow(encoder_output=np.zeros((4, 2), np.float32), prompt=(1,), options=DecodingOptions(), eot=EOT)


def test_the_drafter_offers_the_hypothesis_and_its_fallback_proposes():
    fallback = Recording()
    drafter = HypothesisDrafter(fallback, TS, EOT)
    drafter.remember(PREVIOUS)
    drafter.begin(_window())
    assert drafter.offered([ts(0.0)], 4) == (1, 2, 3, ts(2.0))
    assert drafter.offered([ts(0.0), 1, 2, 3, ts(2.4)], 3) == (ts(2.2), 4, 1)
    drafter.advance(None, 7)
    assert drafter.offered(PREVIOUS[:-1], 3) == (EOT,)
    assert drafter.offered([ts(0.0), 6, 7], 3) == ()  # nothing in common: nothing offered
    assert drafter.propose([ts(0.0), 6, 7], 3).tokens == (42,)  # the fallback proposes
    assert drafter.offered_rounds == 3
    assert fallback.calls == ["begin", ("advance", 7), "propose"]


def test_a_hypothesis_serves_only_the_window_it_was_remembered_for():
    drafter = HypothesisDrafter(Recording(), TS, EOT)
    drafter.remember(PREVIOUS)
    drafter.begin(_window())
    drafter.begin(_window())  # the next window: nothing remembered for it
    assert drafter.offered([ts(0.0)], 4) == ()


def _features(seed, frames=3000, floor=-0.8):
    """[80, frames] Whisper-like log-mel values clamped at ``floor``."""
    values = np.random.default_rng(seed).normal(0.0, 0.5, (80, frames)).astype(np.float32)
    return np.maximum(values, floor)


def test_a_window_is_found_again_by_its_first_second_of_audio():
    from ct2_flash.redecodes.memory import Fingerprint, RecentWindows

    windows = RecentWindows()
    first = _features(0)
    windows.remember(Fingerprint.of(first), PREVIOUS)
    grown = first.copy()
    grown[:, 2000:] = _features(1)[:, 2000:]  # a second more audio at the end changes the tail
    assert windows.recall(Fingerprint.of(grown)) == tuple(PREVIOUS)
    # Louder audio arrived: the buffer's floor rose, and the quiet values at the start with it.
    louder = np.maximum(first, -0.6)
    assert windows.recall(Fingerprint.of(louder)) == tuple(PREVIOUS)
    assert windows.recall(Fingerprint.of(_features(2))) is None  # other audio
    shifted = np.concatenate([first[:, 50:], first[:, :50]], axis=1)  # the buffer's start moved
    assert windows.recall(Fingerprint.of(shifted)) is None


def test_recent_windows_are_bounded_per_thread_and_replaced_by_the_same_audio():
    import threading

    from ct2_flash.redecodes.memory import Fingerprint, RecentWindows

    windows = RecentWindows(size=2)
    prints = [Fingerprint.of(_features(seed)) for seed in range(3)]
    for index, fingerprint in enumerate(prints):
        windows.remember(fingerprint, [index])
    assert windows.recall(prints[0]) is None  # the oldest went
    windows.remember(prints[2], [7])
    assert windows.recall(prints[2]) == (7,) and windows.recall(prints[1]) == (1,)
    seen = []
    thread = threading.Thread(target=lambda: seen.append(windows.recall(prints[2])))
    thread.start()
    thread.join()
    assert seen == [None]  # another thread's stream is its own
    windows.clear()
    assert windows.recall(prints[2]) is None


@pytest.mark.parametrize(
    "case, generated, limit, expected",
    [
        ("one token said again and again", [5, 7, 7, 7, 7, 7, 7, 7], 3, (7, 7, 7)),
        ("a sentence said again", [9, 1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6], 8, (1, 2, 3, 4, 5, 6, 1, 2)),
        ("the repeated unit is the latest one", [1, 2, 3, 4, 5, 6, 8, 1, 2, 3, 4, 5, 6], 2, (8, 1)),
        ("five tokens again are not enough", [1, 2, 3, 4, 5, 9, 1, 2, 3, 4, 5], 4, ()),
        ("no repeat", list(range(20)), 4, ()),
        ("nothing asked", [7] * 10, 0, ()),
    ],
)
def test_a_decode_that_repeats_itself_is_offered_its_repeats(case, generated, limit, expected):
    assert repeated(generated, limit) == expected, case


@pytest.mark.parametrize(
    "case, tokens, loops",
    [
        ("one token again and again", [EOT + 1, 11, 12] + [64] * LOOP_TOKENS, True),
        ("two tokens again and again", [EOT + 1] + [64, 12] * (LOOP_TOKENS // 2), True),
        ("a phrase of ten again and again", list(range(100, 110)) * 4, True),
        ("a phrase of eleven is not a loop", list(range(100, 111)) * 4, False),
        (
            "timestamps between the repeats do not count",
            [t for i in range(12) for t in (TS + i, 7, 8, 9, TS + i + 1)],
            True,
        ),
        ("a loop that ended before the text's end", [64] * 40 + list(range(200, 206)), False),
        ("too little text", [64] * (LOOP_TOKENS - 1) + [EOT, TS], False),
        ("speech", list(range(300, 400)), False),
        ("no prompt", [], False),
    ],
)
def test_a_prompt_ends_in_a_loop_where_its_text_does(case, tokens, loops):
    assert ends_in_loop(tokens, EOT) == loops, case


def test_the_previous_hypothesis_goes_before_the_decodes_own_repeats():
    drafter = HypothesisDrafter(Recording(), TS, EOT)
    drafter.remember([1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 7])
    drafter.begin(_window())
    looping = [1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6]
    assert drafter.offered(looping, 3) == (7,)  # the hypothesis goes on with 7, not with 1 again
    assert drafter.offered(looping + [7, 1, 2, 3, 4, 5, 6, 7], 3) == (1, 2, 3)  # past its end: the repeats
    assert (drafter.offered_rounds, drafter.repeat_rounds) == (1, 1)
    without = HypothesisDrafter(Recording(), TS, EOT)
    without.begin(_window())
    assert without.offered(looping, 2) == (1, 2)


def test_a_stopped_decode_that_repeats_itself_is_offered_past_its_end():
    """A generate() stopped early hands its tokens to the loop without an end of text: where
    they run out, the block goes on with the repeats, not one token a round."""
    stopped = [ts(0.0), 5, 6, 7] + [8, 9] * 8
    drafter = HypothesisDrafter(Recording(), TS, EOT)
    drafter.remember(stopped)
    drafter.begin(_window())
    assert drafter.offered(stopped[:-1], 6) == (9, 8, 9, 8, 9, 8)
    finished = HypothesisDrafter(Recording(), TS, EOT)
    finished.remember(stopped + [EOT])
    finished.begin(_window())
    assert finished.offered(stopped[:-1], 6) == (9, EOT)  # it ended there: nothing after
