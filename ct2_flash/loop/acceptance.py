"""Acceptance of a drafted block: greedy, and speculative sampling.

Vocabulary (as in vLLM's rejection sampler): a round verifies ``[anchor, d_1 .. d_n]`` in one
target pass; row j of the target's output is the token the target itself picks after
``anchor, d_1 .. d_j``. Draft token ``d_{j+1}`` is *accepted* when it equals row j. At the first
mismatch the target's row becomes the *recovered* (correction) token; when all n drafts are
accepted, row n is a free *bonus* token. Either becomes the next round's anchor. An accepted
end-of-text ends the transcript with no bonus, since greedy decoding stops there. A row that
is too close to call in a multi-token pass (``target_token`` returns None) ends the block
*unsure*: the drafts before it are kept, and the loop decides that position again with a
single-token pass.

Under sampling (``sample_accept``) the target's row j is a distribution p_j, and the draft
d_{j+1} was drawn from the drafter's q_j (or proposed outright: q_j is then all on it). The
rule of speculative sampling keeps d with probability min(1, p_j(d) / q_j(d)); at the first
rejection the recovered token is drawn from the residual max(0, p_j - q_j), renormalised, and
after a fully accepted block the bonus token from p_n. Every emitted token is then distributed
exactly as if it had been sampled from the target alone, whatever the drafter proposes.

The loop does not branch on the options of either: it picks a rule per call and passes it
in (``GreedyRule``: greedy, with the guard's thresholds; ``SamplingRule``). Both
take a ``Draft`` (what is verified, ``drafts``) and a ``BlockChoice`` (the target's rows after
the logit rules) and return a ``RoundOutcome``. What is verified is made elsewhere
(``drafts``), and what the cache keeps after an unsure row is the guard's (``guard``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Tuple

import numpy as np

from ct2_flash.loop.drafts import Draft
from ct2_flash.loop.guard import Guard
from ct2_flash.loop.logit_rules import BlockChoice, draw
from ct2_flash.loop.options import DecodingOptions


@dataclass(frozen=True)
class RoundOutcome:
    """Outcome of one verified block.

    Attributes:
        accepted: how many draft tokens were kept (0 .. n).
        next_token: the recovered or bonus token, or None when an accepted end-of-text ended
            the transcript or the row after the accepted drafts was unsure.
        unsure: the target row after the accepted drafts was too close to call.
    """

    accepted: int
    next_token: Optional[int]
    unsure: bool = False

    @property
    def emitted(self) -> int:
        """Tokens this round adds to the output."""
        return self.accepted + (self.next_token is not None)


def greedy_accept(
    draft_tokens: Sequence[int],
    target_token: Callable[[int], Optional[int]],
    eot: int,
) -> RoundOutcome:
    """Keep the longest draft prefix the target agrees with.

    Args:
        draft_tokens: [n] proposed tokens d_1 .. d_n.
        target_token: row index j (0 .. n) -> the target's greedy token after the anchor and
            the first j drafts, or None if that row is too close to call. Called in order and
            only as far as needed, so that rows after a mismatch cost nothing.
        eot: the end-of-text id.
    """
    for j, draft in enumerate(draft_tokens):
        choice = target_token(j)
        if choice is None:
            return RoundOutcome(accepted=j, next_token=None, unsure=True)
        if choice != draft:
            return RoundOutcome(accepted=j, next_token=choice)
        if choice == eot:
            return RoundOutcome(accepted=j + 1, next_token=None)
    choice = target_token(len(draft_tokens))
    return RoundOutcome(accepted=len(draft_tokens), next_token=choice, unsure=choice is None)


def sample_accept(
    draft_tokens: Sequence[int],
    target_probs: Callable[[int], np.ndarray],
    draft_probs: Callable[[int], Optional[np.ndarray]],
    uniforms: Callable[[int], Tuple[float, float]],
    eot: int,
) -> RoundOutcome:
    """Speculative sampling over one verified block (see the module docstring).

    A draft the drafter proposed outright is judged by drawing the target's own token with the
    row's second uniform and keeping the draft if they agree: that keeps it with probability
    p(d) and otherwise yields a token from p without d, as the rule asks, and the emitted token
    is then the very one plain sampling would draw with the same uniform, whatever was drafted.

    Args:
        draft_tokens: [n] proposed tokens d_1 .. d_n.
        target_probs: row index j (0 .. n) -> [vocab] the target's sampling distribution after
            the anchor and the first j drafts (its rules, temperature and top-k applied).
            Called in order and only as far as needed.
        draft_probs: row index j (0 .. n - 1) -> [vocab] the distribution d_{j+1} was drawn
            from, or None when the drafter proposed it outright.
        uniforms: row index j -> two uniforms in [0, 1) for that row's output position (one
            for the acceptance test, one for drawing a token), fixed per position, so that a
            seeded run repeats however the rounds fell.
        eot: the end-of-text id.
    """
    for j, draft in enumerate(draft_tokens):
        p = target_probs(j)
        q = draft_probs(j)
        u_accept, u_draw = uniforms(j)
        if q is None:
            token = draw(p, u_draw)
            if token != draft:
                return RoundOutcome(accepted=j, next_token=token)
        # Accept with probability min(1, p / q); a draft its own distribution gave no mass is
        # rejected.
        elif not (q[draft] > 0 and u_accept * q[draft] < p[draft]):
            residual = np.maximum(p - q, 0.0)
            return RoundOutcome(accepted=j, next_token=draw(residual if residual.sum() > 0 else p, u_draw))
        if draft == eot:
            return RoundOutcome(accepted=j + 1, next_token=None)
    return RoundOutcome(
        accepted=len(draft_tokens), next_token=draw(target_probs(len(draft_tokens)), uniforms(len(draft_tokens))[1])
    )


class GreedyRule:
    """Greedy decoding: keep the longest draft prefix the target agrees with (and the guard
    trusts: ``guard.Guard``'s thresholds); the target's own token at the first disagreement."""

    reads_all_rows = False  # acceptance stops at the first mismatch: so may the logit rules

    def __init__(self, guard: Guard, eot: int) -> None:
        self.guard, self._eot = guard, eot

    def accept(self, draft: Draft, choice: BlockChoice, start: int) -> RoundOutcome:
        drafts = draft.tokens
        # Margins cost another pass over the rows, so only the rows acceptance reads get them:
        # up to the first mismatch (an accepted end-of-text ends the rows read).
        judged = min(len(drafts), len(choice.tokens))
        mismatches = np.flatnonzero(choice.tokens[:judged] != np.asarray(drafts[:judged], dtype=np.int64))
        used = min(1 + (mismatches[0] if mismatches.size else judged), len(choice.tokens))
        thresholds = self.guard.thresholds(used)
        margins = choice.margins(used) if drafts and thresholds.max() > 0 else None
        # A NaN margin (a NaN logit in the row) cannot be judged: unsure, like a close one, so
        # a single-token pass decides that position, never a guess.
        return greedy_accept(
            drafts,
            lambda row: (
                None if margins is not None and not margins[row] >= thresholds[row] else int(choice.tokens[row])
            ),
            self._eot,
        )


class SamplingRule:
    """Temperature sampling: the rejection rule of speculative sampling (``sample_accept``)
    over the target's sampling distributions, with uniforms fixed per output position.

    Args:
        options: the call's options (temperature, top-k).
        uniforms: [positions, 2] per output position, the acceptance test's and the draw's.
        eot: the end-of-text id.
    """

    reads_all_rows = True

    def __init__(self, options: DecodingOptions, uniforms: np.ndarray, eot: int) -> None:
        self.options, self.uniforms, self._eot = options, uniforms, eot

    def accept(self, draft: Draft, choice: BlockChoice, start: int) -> RoundOutcome:
        options = self.options
        return sample_accept(
            draft.tokens,
            lambda row: choice.distribution(row, options.sampling_temperature, options.sampling_topk),
            lambda row: None if draft.probs is None else draft.probs[row],
            lambda row: self.uniforms[start + row],
            self._eot,
        )
