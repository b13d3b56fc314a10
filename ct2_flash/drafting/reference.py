"""Test drafters: an oracle and a random one.

They exist to prove the loop exact at both extremes (a drafter that is always right, or right
up to injected errors, and one that is never useful), as HF transformers' assisted-decoding
tests do. The benchmark uses the oracle to measure the loop's ceiling.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import ctranslate2
import numpy as np

from ct2_flash.drafting.base import Drafter, DraftWindow, Proposal


class OracleDrafter(Drafter):
    """Proposes the target's own greedy continuation, computed with CTranslate2 ``generate()``.

    Continuations are cached per window (prompt, options and a sample of the encoder output),
    so a second pass over the same audio measures the loop without the oracle's own decoding.

    Args:
        reference_model: the ``ctranslate2.models.Whisper`` to ask for the continuation (the
            target itself for a perfect oracle).
        error_rate: probability that each proposed token is replaced by a wrong one.
        seed: seed of the error injection.
    """

    def __init__(self, reference_model, error_rate: float = 0.0, seed: int = 0) -> None:
        if not 0.0 <= error_rate <= 1.0:
            raise ValueError("error_rate must be in [0, 1]")
        self.reference_model = reference_model
        self.error_rate = error_rate
        self._rng = np.random.default_rng(seed)
        self._continuation: List[int] = []
        self._cache: Dict[tuple, List[int]] = {}

    def begin(self, window: DraftWindow) -> None:
        # Every 97th encoder value identifies the window well enough for a test oracle.
        key = (window.prompt, window.options, window.encoder_output.reshape(-1)[::97].tobytes())
        if key not in self._cache:
            self._cache[key] = self._reference(window)
        self._continuation = self._cache[key]

    def _reference(self, window: DraftWindow) -> List[int]:
        encoder_output = ctranslate2.StorageView.from_array(np.ascontiguousarray(window.encoder_output[None]))
        result = self.reference_model.generate(
            encoder_output, [list(window.prompt)], **window.options.generate_kwargs()
        )[0]
        # sequences_ids holds the forced prefix too, so indices match `generated`; the end
        # of text is dropped by CTranslate2 and is proposed after the last token.
        return list(result.sequences_ids[0]) + [window.eot]

    def propose(self, generated: Sequence[int], num_tokens: int) -> Proposal:
        tokens = list(self._continuation[len(generated) : len(generated) + num_tokens])
        for j in range(len(tokens)):
            if self._rng.random() < self.error_rate:
                tokens[j] = (tokens[j] + 1 + int(self._rng.integers(1000))) % 50000
        return Proposal(tokens=tuple(tokens))


class RandomDrafter(Drafter):
    """Proposes uniformly random tokens: never useful, must never change the output."""

    def __init__(self, vocab_size: int, seed: int = 0, vocab_size_check: Optional[int] = None) -> None:
        self._vocab = vocab_size
        self.vocab_size = vocab_size_check
        self._rng = np.random.default_rng(seed)

    def begin(self, window: DraftWindow) -> None:
        pass

    def propose(self, generated: Sequence[int], num_tokens: int) -> Proposal:
        return Proposal(tokens=tuple(int(t) for t in self._rng.integers(0, self._vocab, size=num_tokens)))
