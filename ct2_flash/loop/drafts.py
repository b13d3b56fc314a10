"""What a round verifies after its anchor (``Draft``), made from the drafter's proposal: as
proposed (greedy, or sampling that proposes outright), or drawn from the drafter's own
distribution under sampling (``DrawnDrafts``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

from ct2_flash.drafting.base import Proposal
from ct2_flash.loop.logit_rules import LogitRules, draw, sampling_distribution
from ct2_flash.loop.options import DecodingOptions


@dataclass(frozen=True)
class Draft:
    """What a round verifies after its anchor.

    Attributes:
        tokens: [n] drafts.
        confidences: [n] the drafter's log-probability of each (or fewer, when it gives none).
        probs: [n, vocab] under sampling, the distributions the drafts were drawn from; None:
            proposed outright.
        rows: draft positions the drafter was asked to compute (0: no proposal this round).
        drawn: the drafts were drawn from the drafter's own distribution.
        offered: the drafts were offered (``Drafter.offered``), not proposed.
        resumed: drafting resumed in its window with this round (a probe after a pause).
    """

    tokens: Sequence[int] = ()
    confidences: Sequence[float] = ()
    probs: Optional[np.ndarray] = None
    rows: int = 0
    drawn: bool = False
    offered: bool = False
    resumed: bool = False


def as_proposed(proposal: Proposal, tokens: Sequence[int], confidences: Sequence[float]) -> Draft:
    """The proposal's first ``tokens`` (and their confidences) verified as they are."""
    return Draft(tokens=tuple(tokens), confidences=tuple(confidences), probs=proposal.probs)


class ProposedDrafts:
    """The proposal's tokens verified as they are (greedy decoding; sampling that proposes
    outright)."""

    def drafts(
        self,
        proposal: Proposal,
        tokens: Sequence[int],
        confidences: Sequence[float],
        rules: LogitRules,
        generated: Sequence[int],
    ) -> Draft:
        """The tokens as proposed."""
        return as_proposed(proposal, tokens, confidences)


class DrawnDrafts:
    """Under sampling, drafts drawn from the drafter's own distribution q where it gives
    logits, so that the rejection rule compares p with the q they came from.

    Args:
        options: the call's options (temperature, top-k).
        draft_uniforms: [positions] one uniform per output position, a stream of its own.
    """

    def __init__(self, options: DecodingOptions, draft_uniforms: np.ndarray) -> None:
        self.options, self.draft_uniforms = options, draft_uniforms

    def drafts(
        self,
        proposal: Proposal,
        tokens: Sequence[int],
        confidences: Sequence[float],
        rules: LogitRules,
        generated: Sequence[int],
    ) -> Draft:
        if not (proposal.logits is not None and tokens):
            return as_proposed(proposal, tokens, confidences)
        drawn, probs = self.draw_from(proposal, len(tokens), rules, generated)
        return Draft(tokens=tuple(drawn), confidences=tuple(confidences[: len(drawn)]), probs=probs, drawn=True)

    def draw_from(
        self, proposal: Proposal, count: int, rules: LogitRules, generated: Sequence[int]
    ) -> Tuple[List[int], Optional[np.ndarray]]:
        """Draw up to ``count`` drafts from the drafter's distribution q at each position.

        Each row of the proposal's logits is scattered into the whole vocabulary (tokens off
        the drafter's shortlist get none), edited by the target's logit rules given the tokens
        before it, drafts included, and scaled by the temperature and top-k of the call, so
        that the drafter never proposes what the target rules out. Stops early at a row the
        rules leave empty or after an end-of-text.

        Returns:
            the drafts [n'] and their distributions [n', vocab] (None when n' = 0).
        """
        options, special = self.options, rules.special
        start, vocabulary = len(generated), proposal.vocabulary
        rows = np.full((count, special.vocab_size), -np.inf, dtype=np.float32)
        rows[:, vocabulary] = proposal.logits[:count]
        drafts: List[int] = []
        probs = np.zeros((count, special.vocab_size))
        for j in range(count):
            rules.apply(rows[j], [*generated, *drafts])
            # q lives on the shortlist: softmax and draw over its columns only.
            short = rows[j, vocabulary]
            if not np.isfinite(short.max()):
                break
            q = sampling_distribution(short, options.sampling_temperature, options.sampling_topk)
            drafts.append(int(vocabulary[draw(q, float(self.draft_uniforms[start + j]))]))
            probs[j, vocabulary] = q
            if drafts[-1] == special.eot:
                break
        return drafts, (probs[: len(drafts)] if drafts else None)
