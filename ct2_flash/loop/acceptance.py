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

The loop does not branch on the options of either: it picks a strategy per call and passes it
in (``GreedyAcceptance``: the rule with the guard; ``SampledAcceptance``). Both take a
``Draft`` (what is verified) and a ``BlockChoice`` (the target's rows after the logit rules)
and return an ``Acceptance``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

from ct2_flash.drafting.base import DecodingOptions, Proposal
from ct2_flash.loop.logit_rules import BlockChoice, LogitRules, sampling_distribution


@dataclass(frozen=True)
class Acceptance:
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
) -> Acceptance:
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
            return Acceptance(accepted=j, next_token=None, unsure=True)
        if choice != draft:
            return Acceptance(accepted=j, next_token=choice)
        if choice == eot:
            return Acceptance(accepted=j + 1, next_token=None)
    choice = target_token(len(draft_tokens))
    return Acceptance(accepted=len(draft_tokens), next_token=choice, unsure=choice is None)


def sample_accept(
    draft_tokens: Sequence[int],
    target_probs: Callable[[int], np.ndarray],
    draft_probs: Callable[[int], Optional[np.ndarray]],
    uniforms: Callable[[int], Tuple[float, float]],
    eot: int,
) -> Acceptance:
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
                return Acceptance(accepted=j, next_token=token)
        # Accept with probability min(1, p / q); a draft its own distribution gave no mass is
        # rejected.
        elif not (q[draft] > 0 and u_accept * q[draft] < p[draft]):
            residual = np.maximum(p - q, 0.0)
            return Acceptance(accepted=j, next_token=draw(residual if residual.sum() > 0 else p, u_draw))
        if draft == eot:
            return Acceptance(accepted=j + 1, next_token=None)
    return Acceptance(
        accepted=len(draft_tokens), next_token=draw(target_probs(len(draft_tokens)), uniforms(len(draft_tokens))[1])
    )


def draw(weights: np.ndarray, uniform: float) -> int:
    """The index the inverse CDF of ``weights`` ([vocab], >= 0, not all 0; normalised here)
    gives at ``uniform`` in [0, 1)."""
    cumulative = np.cumsum(weights, dtype=np.float64)
    index = int(np.searchsorted(cumulative, uniform * cumulative[-1], side="right"))
    # Rounding can put the point at the very end: take the last token with any weight.
    return index if index < len(weights) else int(np.flatnonzero(weights)[-1])


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


class Guard:
    """The int8 guard: a verified row too close to call is decided again by a single pass.

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

    def cache_rows(self, outcome: Acceptance) -> int:
        """Positions of the verified block ``[anchor, d_1 ..]`` the cache keeps: the anchor and
        the accepted drafts, less the last of them after an unsure row."""
        return outcome.accepted + (0 if outcome.unsure else 1)

    def after_round(self, outcome: Acceptance) -> None:
        self.single_pass_next = outcome.unsure

    def allows_drafts(self) -> bool:
        """False while an unsure position waits for its single-token pass."""
        return not self.single_pass_next


class GreedyAcceptance:
    """Greedy decoding: keep the longest draft prefix the target agrees with (and the guard
    trusts); the target's own token at the first disagreement."""

    reads_all_rows = False  # acceptance stops at the first mismatch: so may the logit rules

    def __init__(self, guard: Guard, eot: int) -> None:
        self.guard, self._eot = guard, eot

    def drafts(
        self,
        proposal: Proposal,
        tokens: Sequence[int],
        confidences: Sequence[float],
        rules: LogitRules,
        generated: Sequence[int],
    ) -> Draft:
        """Greedy verifies the proposal's tokens as they are."""
        return Draft(tokens=tuple(tokens), confidences=tuple(confidences), probs=proposal.probs)

    def accept(self, draft: Draft, choice: BlockChoice, start: int) -> Acceptance:
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


class SampledAcceptance:
    """Temperature sampling: the rejection rule of speculative sampling (``sample_accept``)
    over the target's sampling distributions, with uniforms fixed per output position.

    Args:
        options: the call's options (temperature, top-k).
        uniforms: [positions, 2] per output position, the acceptance test's and the draw's.
        draft_uniforms: [positions] for drafts drawn from the drafter's distribution.
        draw_drafts: draw drafts from the drafter's own distribution where it gives logits;
            False proposes its most likely tokens outright.
        eot: the end-of-text id.
    """

    reads_all_rows = True

    def __init__(
        self, options: DecodingOptions, uniforms: np.ndarray, draft_uniforms: np.ndarray, draw_drafts: bool, eot: int
    ) -> None:
        self.options, self.uniforms, self.draft_uniforms = options, uniforms, draft_uniforms
        self.draw_drafts, self._eot = draw_drafts, eot
        self.guard = Guard(np.zeros(1))  # a sampled row's distribution is used as verified

    def drafts(
        self,
        proposal: Proposal,
        tokens: Sequence[int],
        confidences: Sequence[float],
        rules: LogitRules,
        generated: Sequence[int],
    ) -> Draft:
        if not (self.draw_drafts and proposal.logits is not None and tokens):
            return Draft(tokens=tuple(tokens), confidences=tuple(confidences), probs=proposal.probs)
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

    def accept(self, draft: Draft, choice: BlockChoice, start: int) -> Acceptance:
        options = self.options
        return sample_accept(
            draft.tokens,
            lambda row: choice.distribution(row, options.sampling_temperature, options.sampling_topk),
            lambda row: None if draft.probs is None else draft.probs[row],
            lambda row: self.uniforms[start + row],
            self._eot,
        )
