"""The margin guard: a row of a multi-token pass too close to call is decided again by a single
pass, the computation plain greedy does; what the cache keeps and whether the next round may
draft follow from it. It runs at every compute type where its margins (``guard_margin``) are
above zero, not only at int8."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ct2_flash.loop.acceptance import RoundOutcome


class Guard:
    """The margin guard: a verified row too close to call is decided again by a single pass
    (all-zero margins turn it off, as under sampling, whose rows are used as verified).

    The decision and both of its effects live here. A row of a multi-token pass whose greedy
    choice is within ``margins[j]`` logits of going another way (``LogitRules.choose``'s margin;
    the last entry serves longer blocks) is *unsure*; the round then keeps the drafts before it
    but not the row's own position in the cache (the last kept token becomes the anchor again),
    and the next round verifies that anchor alone, the computation plain greedy does.

    Args:
        margins: [rows] float64, >= 0; all zero turns the guard off.
    """

    def __init__(self, margins: np.ndarray) -> None:
        self.margins = margins
        self.single_pass_next = False

    def thresholds(self, rows: int) -> np.ndarray:
        """[rows] the margin each of the first ``rows`` rows must reach."""
        return self.margins[np.minimum(np.arange(rows), self.margins.size - 1)]

    def cache_rows(self, outcome: RoundOutcome) -> int:
        """Positions of the verified block ``[anchor, d_1 ..]`` the cache keeps: the anchor and
        the accepted drafts, less the last of them after an unsure row."""
        return outcome.accepted + (0 if outcome.unsure else 1)

    def after_round(self, outcome: RoundOutcome) -> None:
        self.single_pass_next = outcome.unsure

    def allows_drafts(self) -> bool:
        """False while an unsure position waits for its single-token pass."""
        return not self.single_pass_next
