"""Whether drafting pays inside a window (``adaptive`` only): stop it where it is slower than
plain steps, probe it again later. The output is the same either way."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

# After drafting stopped in a window, plain steps run for this many tokens before DraftPause
# probes drafting again (a window's later speech may suit the drafter better than its start;
# a probe that fails costs a few rounds' overhead, little against the stretch).
RESUME_AFTER_TOKENS = 32

# Until a single-token pass has been timed, a plain step is taken to cost this fraction of a
# 9-token verification (the measured ratios: docs/measurements.md, "Figures behind the code's constants").
STEP_OVER_VERIFY = 0.55


def resume_position(emitted: int) -> int:
    """Where a window that stopped drafting after ``emitted`` tokens probes it again."""
    return emitted + RESUME_AFTER_TOKENS


@dataclass
class DraftPause:
    """Decides whether drafting pays in the current stretch of a window.

    After ``min_rounds`` drafting rounds it compares their measured time per emitted token
    (drafter + verification + bookkeeping) with what a plain step would cost: the measured
    single-token pass (or, before one was timed, the mean round's verification scaled by
    ``STEP_OVER_VERIFY``) plus the same bookkeeping.
    """

    min_rounds: int = 3
    rounds: int = 0
    emitted: int = 0
    round_seconds: float = 0.0
    drafter_seconds: float = 0.0
    verify_seconds: float = 0.0

    def record(self, emitted: int, round_seconds: float, drafter_seconds: float, verify_seconds: float) -> None:
        self.rounds += 1
        self.emitted += emitted
        self.round_seconds += round_seconds
        self.drafter_seconds += drafter_seconds
        self.verify_seconds += verify_seconds

    def pays(self, step_seconds: Optional[float] = None) -> bool:
        """Whether drafting is at least as fast per token as plain steps.

        Args:
            step_seconds: measured time of a single-token target pass, if known.
        """
        if self.rounds < self.min_rounds:
            return True
        if self.emitted == 0:
            return False
        bookkeeping = (self.round_seconds - self.drafter_seconds - self.verify_seconds) / self.rounds
        if step_seconds is None:
            step_seconds = STEP_OVER_VERIFY * self.verify_seconds / self.rounds
        plain_step = step_seconds + bookkeeping
        return self.round_seconds / self.emitted <= plain_step
