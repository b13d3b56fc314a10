"""What every trained drafter's round takes: its options, checked once at construction, and
the cut of a proposal by the drafter's own confidence."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Sequence

import numpy as np

from ct2_flash.drafting.base import Proposal


def cut_by_confidence(proposal: Proposal, min_confidence: float) -> Proposal:
    """The prefix of ``proposal`` whose joint drafter probability stays >= ``min_confidence``.

    An unlikely token rarely pays for its share of the verification; 0 keeps everything.
    """
    if min_confidence <= 0.0 or not proposal.log_probs:
        return proposal
    keep = int(np.sum(np.cumsum(proposal.log_probs) >= math.log(min_confidence)))
    return replace(
        proposal,
        tokens=proposal.tokens[:keep],
        log_probs=proposal.log_probs[:keep],
        logits=None if proposal.logits is None else proposal.logits[:keep],
    )


def check_round_options(precision: str, precisions: Sequence[str], min_confidence: float, threads: int) -> None:
    """The options every trained drafter's round takes, checked once at construction."""
    if precision not in precisions:
        raise ValueError(f"precision must be one of {tuple(precisions)}, got {precision!r}")
    if not 0.0 <= min_confidence < 1.0:
        raise ValueError("min_confidence must be in [0, 1)")
    if threads < 1:
        raise ValueError("threads must be >= 1")
