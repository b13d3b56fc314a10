"""How many drafts a round asks for and verifies: expected tokens per second, measured.

A round decides twice. Before the proposal it chooses k, the number of mask rows the drafter
computes (its cost grows with them). After it, knowing the drafter's confidences, it chooses n <= k, the
number of drafts sent to verification. With q_j the probability that the target accepts
position j given the ones before it, the expected output of verifying n drafts is

    E(n) = 1 + sum_{j <= n} q_1 * ... * q_j          (the recovered or bonus token is the 1)

Each choice maximises E over what it costs, with costs fitted online from this loop's own
timings and close to linear on these CPUs (``LinearCost``):

- k maximises E(k) / (verify(k) + propose(k)), with q_j the acceptance observed at position j
  in recent rounds, and then asks for one row more, so that the loop keeps seeing whether
  longer drafts would pay;
- n maximises E(n) / verify(n), with q_j calibrated from the drafter's confidence p_j: it starts
  from the drafter's own probabilities (q = p) as a prior worth a few rounds and moves to the
  observed acceptance rate per confidence bin. n = 0 makes the round a plain step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

import numpy as np

CONFIDENCE_BINS = 10
# Weight of the priors (q = p in each confidence bin; PRIOR_POSITION_ACCEPTANCE at each
# position), in rounds.
PRIOR_ROUNDS = 4.0
PRIOR_POSITION_ACCEPTANCE = 0.5
# Forgetting of the cost fits and of the acceptance by position (per round): recent rounds
# describe the current load and the current speech.
COST_DECAY = 0.98
POSITION_DECAY = 0.98
# What one more row adds to a pass, as a fraction of the pass without it, assumed until passes
# of different lengths were timed (the figures: docs/measurements.md, "Figures behind the code's constants").
VERIFY_ROW_FRACTION = 0.1
PROPOSE_ROW_FRACTION = 0.14
# Offered tokens (a previous hypothesis of the same audio): the most verified in one block, and
# the acceptance assumed per token until rounds were seen (most of a re-decode's tokens stand in
# the previous hypothesis; the figure: docs/measurements.md, "Figures behind the code's constants").
MAX_OFFERED = 32
PRIOR_OFFERED_ACCEPTANCE = 0.85


@dataclass
class LinearCost:
    """seconds(n) = a + b * n, fitted by least squares to recent passes (decayed by
    ``COST_DECAY``); until passes of two different n were seen, b = ``row_fraction`` * a."""

    row_fraction: float
    _weight: float = 0.0
    _sum_n: float = 0.0
    _sum_nn: float = 0.0
    _sum_t: float = 0.0
    _sum_nt: float = 0.0

    @property
    def timed(self) -> bool:
        """Whether any pass was observed (before, costs are in relative units)."""
        return self._weight > 0.0

    def observe(self, n: int, seconds: float) -> None:
        self._weight = COST_DECAY * self._weight + 1.0
        self._sum_n = COST_DECAY * self._sum_n + n
        self._sum_nn = COST_DECAY * self._sum_nn + n * n
        self._sum_t = COST_DECAY * self._sum_t + seconds
        self._sum_nt = COST_DECAY * self._sum_nt + n * seconds

    def fit(self) -> Tuple[float, float]:
        """(b, a); (row_fraction, 1) before any pass."""
        if self._weight == 0.0:
            return self.row_fraction, 1.0
        mean_n, mean_t = self._sum_n / self._weight, self._sum_t / self._weight
        variance = self._sum_nn / self._weight - mean_n**2
        if variance < 1e-6:
            intercept = mean_t / (1.0 + self.row_fraction * mean_n)
            return self.row_fraction * intercept, intercept
        slope = max((self._sum_nt / self._weight - mean_n * mean_t) / variance, 0.0)
        return slope, max(mean_t - slope * mean_n, 1e-9)

    def __call__(self, n) -> np.ndarray:
        slope, intercept = self.fit()
        return intercept + slope * np.asarray(n, dtype=np.float64)


@dataclass
class DraftLengths:
    """Chooses k and n per round and learns from the outcome.

    Attributes:
        proposed: [bins] positions proposed whose predecessors were all accepted, by bin of
            the drafter's confidence.
        accepted: [bins] of those, how many the target accepted.
        verification: seconds of a verification of n drafts (n + 1 rows).
        proposal: seconds of a proposal of k mask rows.
    """

    proposed: np.ndarray = field(default_factory=lambda: np.zeros(CONFIDENCE_BINS))
    accepted: np.ndarray = field(default_factory=lambda: np.zeros(CONFIDENCE_BINS))
    verification: LinearCost = field(default_factory=lambda: LinearCost(VERIFY_ROW_FRACTION))
    proposal: LinearCost = field(default_factory=lambda: LinearCost(PROPOSE_ROW_FRACTION))
    # [positions] decayed counts by draft position: judged (every draft before it accepted), accepted.
    _judged_at: np.ndarray = field(default_factory=lambda: np.zeros(0))
    _accepted_at: np.ndarray = field(default_factory=lambda: np.zeros(0))
    # Decayed counts of offered tokens judged and accepted (``offered`` / ``observe_offered``).
    _offered_judged: float = 0.0
    _offered_accepted: float = 0.0

    @staticmethod
    def bins(log_probs: Sequence[float]) -> List[int]:
        """Confidence bin of each position: [n] log-probabilities -> [n] bin indices (a list:
        a round has a few, and Python reads them faster than numpy would)."""
        return [min(int(math.exp(p) * CONFIDENCE_BINS), CONFIDENCE_BINS - 1) for p in log_probs]

    def acceptance(self, log_probs: Sequence[float]) -> np.ndarray:
        """[n] calibrated probability that each position is accepted, given the ones before."""
        probs = np.exp(np.asarray(log_probs, dtype=np.float64))
        index = self.bins(log_probs)
        prior = PRIOR_ROUNDS * probs
        return (self.accepted[index] + prior) / (self.proposed[index] + PRIOR_ROUNDS)

    def acceptance_by_position(self, count: int) -> np.ndarray:
        """[count] probability that the draft at each position is accepted given the ones
        before, from recent rounds, whatever the drafter's confidence."""
        self._grow(count)
        prior = PRIOR_ROUNDS * PRIOR_POSITION_ACCEPTANCE
        return (self._accepted_at[:count] + prior) / (self._judged_at[:count] + PRIOR_ROUNDS)

    def verify_cost(self, n: np.ndarray) -> np.ndarray:
        """Expected seconds to verify n drafts (n + 1 rows); relative units before any data."""
        return self.verification(n)

    def rows(self, limit: int) -> int:
        """How many drafts (1 .. limit) to ask the drafter for, before it has proposed.

        All of them until both a verification and a proposal were timed (the two costs are
        added, so both must be in seconds).
        """
        if limit <= 1 or not (self.verification.timed and self.proposal.timed):
            return max(limit, 1)
        counts = np.arange(1, limit + 1)
        expected = 1.0 + np.cumsum(np.cumprod(self.acceptance_by_position(limit)))  # E(1 .. limit)
        rate = expected / (self.verification(counts) + self.proposal(counts))
        return min(limit, int(counts[np.argmax(rate)]) + 1)

    def choose(self, log_probs: Sequence[float]) -> int:
        """The number of drafts (0 .. len(log_probs)) with the most expected tokens per second."""
        if not len(log_probs):
            return 0
        expected = 1.0 + np.concatenate([[0.0], np.cumsum(np.cumprod(self.acceptance(log_probs)))])  # E(0 .. n)
        rate = expected / self.verify_cost(np.arange(len(expected)))
        return int(np.argmax(rate))

    def offered(self, available: int) -> int:
        """How many of ``available`` offered tokens (0 .. available) to verify: the most
        expected tokens per second, with each token accepted with the rate observed for offered
        tokens (given the ones before it) and the verification cost every pass teaches.

        Offered tokens cost nothing to propose and are judged apart from the drafter's: a
        previous hypothesis runs right for long stretches, then wrong where the audio grew.
        """
        if available <= 0:
            return 0
        prior = PRIOR_ROUNDS * PRIOR_OFFERED_ACCEPTANCE
        rate = (self._offered_accepted + prior) / (self._offered_judged + PRIOR_ROUNDS)
        counts = np.arange(available + 1)
        expected = 1.0 + np.concatenate([[0.0], np.cumsum(rate ** counts[1:])])  # E(0 .. available)
        return int(np.argmax(expected / self.verify_cost(counts)))

    def observe_offered(self, drafts: int, accepted: int, rejected: bool, verify_seconds: float) -> None:
        """Learn from one verification of ``drafts`` offered tokens (as ``observe``)."""
        self._offered_judged = POSITION_DECAY * self._offered_judged + accepted + int(rejected)
        self._offered_accepted = POSITION_DECAY * self._offered_accepted + accepted
        self.verification.observe(drafts, verify_seconds)

    def observe_proposal(self, rows: int, seconds: float) -> None:
        """Learn what a proposal of ``rows`` mask rows cost."""
        self.proposal.observe(rows, seconds)

    def observe(
        self,
        drafts: int,
        accepted: int,
        rejected: bool,
        verify_seconds: float,
        log_probs: Optional[Sequence[float]] = None,
    ) -> None:
        """Learn from one verification of ``drafts`` drafts.

        Args:
            drafts: drafts verified (0: a plain step).
            accepted: drafts kept.
            rejected: whether the draft after them was judged and rejected (not when all were
                accepted, or when the guard left its row unsure).
            verify_seconds: the engine's time for the pass.
            log_probs: [drafts] the drafter's confidences of the drafts, if it gives them.
        """
        # Positions after the first rejected one were not judged on their own.
        judged = accepted + int(rejected)
        if log_probs is not None:
            for position, index in enumerate(self.bins(log_probs[:judged])):
                self.proposed[index] += 1.0
                self.accepted[index] += position < accepted
        if drafts:
            self._grow(drafts)
            self._judged_at *= POSITION_DECAY
            self._accepted_at *= POSITION_DECAY
            self._judged_at[:judged] += 1.0
            self._accepted_at[:accepted] += 1.0
        self.verification.observe(drafts, verify_seconds)

    def calibration(self) -> List[dict]:
        """Observed against predicted acceptance per confidence bin (for the benchmark's plot)."""
        return [
            {
                "confidence": (b + 0.5) / CONFIDENCE_BINS,
                "proposed": int(self.proposed[b]),
                "observed": float(self.accepted[b] / self.proposed[b]) if self.proposed[b] else math.nan,
            }
            for b in range(CONFIDENCE_BINS)
        ]

    def _grow(self, count: int) -> None:
        if count > len(self._judged_at):
            extra = np.zeros(count - len(self._judged_at))
            self._judged_at = np.concatenate([self._judged_at, extra])
            self._accepted_at = np.concatenate([self._accepted_at, extra])
