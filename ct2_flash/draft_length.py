"""How many of the drafter's tokens a round verifies: expected tokens per second, measured.

A round has already paid for its proposal when it decides; what it chooses is n, the number of
drafts it sends to verification. With the drafter's per-position confidences p_1 .. p_K
(log-probabilities of its own tokens) mapped to the probability that the target accepts each
position given the ones before it (q_j, calibrated online from what this loop has seen), the
expected output of verifying n drafts is

    E(n) = 1 + sum_{j <= n} q_1 * ... * q_j          (the recovered or bonus token is the 1)

and its cost is the engine's measured time to verify n + 1 rows, close to linear in n on
these CPUs: cost(n) = a + b * n, fitted online from the verifications this loop ran. The round
verifies the n that maximises E(n) / cost(n); n = 0 makes it a plain step.

Calibration starts from the drafter's own probabilities (q = p) as a prior worth a few rounds
and moves to the observed acceptance rate per confidence bin.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List, Sequence

import numpy as np

CONFIDENCE_BINS = 10
# Weight of the prior (q = p) in each bin, in rounds.
PRIOR_ROUNDS = 4.0
# Forgetting of the cost fit (per verification): recent passes describe the current load.
COST_DECAY = 0.98


@dataclass
class DraftLengthPolicy:
    """Chooses n per round and learns from the outcome.

    Attributes:
        proposed: [bins] positions proposed whose predecessors were all accepted, by bin of
            the drafter's confidence.
        accepted: [bins] of those, how many the target accepted.
    """

    proposed: np.ndarray = field(default_factory=lambda: np.zeros(CONFIDENCE_BINS))
    accepted: np.ndarray = field(default_factory=lambda: np.zeros(CONFIDENCE_BINS))
    # Decayed sums for the least-squares fit of verification seconds on n.
    _weight: float = 0.0
    _sum_n: float = 0.0
    _sum_nn: float = 0.0
    _sum_t: float = 0.0
    _sum_nt: float = 0.0

    @staticmethod
    def bins(log_probs: Sequence[float]) -> np.ndarray:
        """Confidence bin of each position: [n] log-probabilities -> [n] bin indices."""
        probs = np.exp(np.asarray(log_probs, dtype=np.float64))
        return np.minimum((probs * CONFIDENCE_BINS).astype(int), CONFIDENCE_BINS - 1)

    def acceptance(self, log_probs: Sequence[float]) -> np.ndarray:
        """[n] calibrated probability that each position is accepted, given the ones before."""
        probs = np.exp(np.asarray(log_probs, dtype=np.float64))
        index = self.bins(log_probs)
        prior = PRIOR_ROUNDS * probs
        return (self.accepted[index] + prior) / (self.proposed[index] + PRIOR_ROUNDS)

    def verify_cost(self, n: np.ndarray) -> np.ndarray:
        """Expected seconds to verify n drafts (n + 1 rows); relative units before any data."""
        slope, intercept = self._fit()
        return intercept + slope * np.asarray(n, dtype=np.float64)

    def _fit(self):
        """(b, a) of cost = a + b n; a prior of b = 0.1 a until two different n were seen."""
        if self._weight == 0.0:
            return 0.1, 1.0
        mean_n, mean_t = self._sum_n / self._weight, self._sum_t / self._weight
        variance = self._sum_nn / self._weight - mean_n**2
        if variance < 1e-6:
            return 0.1 * mean_t, mean_t
        slope = max((self._sum_nt / self._weight - mean_n * mean_t) / variance, 0.0)
        return slope, max(mean_t - slope * mean_n, 1e-9)

    def choose(self, log_probs: Sequence[float]) -> int:
        """The number of drafts (0 .. len(log_probs)) with the most expected tokens per second."""
        if not len(log_probs):
            return 0
        expected = 1.0 + np.concatenate([[0.0], np.cumsum(np.cumprod(self.acceptance(log_probs)))])  # E(0 .. n)
        rate = expected / self.verify_cost(np.arange(len(expected)))
        return int(np.argmax(rate))

    def observe(self, log_probs: Sequence[float], accepted: int, rejected: bool, verify_seconds: float) -> None:
        """Learn from one verification of ``len(log_probs)`` drafts.

        Args:
            log_probs: [n] the drafter's confidences of the verified drafts (empty: a plain step).
            accepted: drafts kept.
            rejected: whether the draft after them was judged and rejected (not when all were
                accepted, or when the guard left its row unsure).
            verify_seconds: the engine's time for the pass.
        """
        n = len(log_probs)
        # Positions after the first rejected one were not judged on their own.
        index = self.bins(log_probs)[: accepted + int(rejected)]
        np.add.at(self.proposed, index, 1.0)
        np.add.at(self.accepted, index[:accepted], 1.0)
        self._weight = COST_DECAY * self._weight + 1.0
        self._sum_n = COST_DECAY * self._sum_n + n
        self._sum_nn = COST_DECAY * self._sum_nn + n * n
        self._sum_t = COST_DECAY * self._sum_t + verify_seconds
        self._sum_nt = COST_DECAY * self._sum_nt + n * verify_seconds

    def calibration(self) -> List[dict]:
        """Observed against predicted acceptance per confidence bin (for the benchmark's plot)."""
        return [
            {"confidence": (b + 0.5) / CONFIDENCE_BINS, "proposed": int(self.proposed[b]),
             "observed": float(self.accepted[b] / self.proposed[b]) if self.proposed[b] else math.nan}
            for b in range(CONFIDENCE_BINS)
        ]
