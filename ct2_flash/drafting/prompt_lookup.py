"""The built-in zero-cost drafter: prompt lookup."""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

from ct2_flash.drafting.base import Drafter, DraftWindow, Proposal


class PromptLookupDrafter(Drafter):
    """Zero-cost drafter: copy what followed the latest earlier occurrence of the last n-gram.

    It looks for the last ``max_ngram`` tokens (then shorter n-grams, down to ``min_ngram``) earlier in the prompt and
    the generated text and proposes the tokens that followed there. It knows nothing of the
    audio, so it only helps on repeated phrases; when it finds no match it proposes nothing,
    which makes the round a plain greedy step. It is the default until a trained drafter ships.
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 2) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError("need 1 <= min_ngram <= max_ngram")
        self.max_ngram = max_ngram
        # A single matching token is a weak signal; a wrong block costs more than a step.
        self.min_ngram = min_ngram
        self._prompt: Tuple[int, ...] = ()

    def begin(self, window: DraftWindow) -> None:
        self._prompt = window.prompt

    def propose(self, generated: Sequence[int], num_tokens: int) -> Proposal:
        history = list(self._prompt) + list(generated)
        for size in range(min(self.max_ngram, len(history) - 1), self.min_ngram - 1, -1):
            # Latest earlier occurrence: recent context predicts best.
            start = latest_occurrence(history, size)
            if start is not None:
                return Proposal(tokens=tuple(history[start + size : start + size + num_tokens]))
        return Proposal(tokens=())


def latest_occurrence(history: Sequence[int], size: int) -> Optional[int]:
    """Where the last ``size`` tokens of ``history`` occurred before (the latest start that
    leaves at least one token between that occurrence's end and the end), or None."""
    pattern = list(history[-size:])
    for start in range(len(history) - size - 1, -1, -1):
        if list(history[start : start + size]) == pattern:
            return start
    return None
