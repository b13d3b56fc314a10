"""The margin guard (``loop/guard.py``): what the cache keeps and when drafting waits."""

import numpy as np

from ct2_flash.loop.acceptance import RoundOutcome
from ct2_flash.loop.guard import Guard


def test_the_last_margin_serves_longer_blocks():
    guard = Guard(np.array([3.0, 2.0, 1.0]))
    np.testing.assert_array_equal(guard.thresholds(5), [3.0, 2.0, 1.0, 1.0, 1.0])


def test_an_unsure_row_keeps_the_accepted_drafts_and_waits_for_a_single_pass():
    guard = Guard(np.array([2.0]))
    sure = RoundOutcome(accepted=3, next_token=7)
    assert guard.cache_rows(sure) == 4  # the anchor and the three drafts
    guard.after_round(sure)
    assert guard.allows_drafts()
    unsure = RoundOutcome(accepted=3, next_token=None, unsure=True)
    assert guard.cache_rows(unsure) == 3  # the last kept draft is the anchor again
    guard.after_round(unsure)
    assert not guard.allows_drafts()  # the next round verifies the anchor alone
    guard.after_round(RoundOutcome(accepted=0, next_token=5))
    assert guard.allows_drafts()
