"""Greedy acceptance of a drafted block.

Vocabulary (as in vLLM's rejection sampler): a round verifies ``[anchor, d_1 .. d_n]`` in one
target pass; row j of the target's output is the token the target itself picks after
``anchor, d_1 .. d_j``. Draft token ``d_{j+1}`` is *accepted* when it equals row j. At the first
mismatch the target's row becomes the *recovered* (correction) token; when all n drafts are
accepted, row n is a free *bonus* token. Either becomes the next round's anchor. An accepted
end-of-text ends the transcript with no bonus, since greedy decoding stops there. A row that
is too close to call in a multi-token pass (``target_token`` returns None) ends the block
*unsure*: the drafts before it are kept, and the loop decides that position again with a
single-token pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence


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
