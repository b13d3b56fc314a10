"""The options of one ``generate()`` call as the loop reads them, checked once, and the one
definition of greedy against sampled decoding."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Tuple


def draws_at_random(sampling_topk: int = 1, sampling_temperature: float = 1.0) -> bool:
    """Whether CTranslate2 draws each token at random with these options (its ``RandomSampler``:
    top-k other than 1 at a temperature other than 0) rather than taking the argmax; the
    defaults are CTranslate2's. The one definition of sampling against greedy decoding."""
    return sampling_topk != 1 and sampling_temperature != 0


def one_greedy_hypothesis(generate_options) -> bool:
    """Whether ``Whisper.generate(**generate_options)`` decodes one greedy hypothesis per row:
    ``beam_size=1`` given (CTranslate2 defaults to 5), the argmax (``draws_at_random``), one
    hypothesis."""
    return (
        generate_options.get("beam_size", 5) == 1
        and generate_options.get("num_hypotheses", 1) == 1
        and not draws_at_random(
            generate_options.get("sampling_topk", 1), generate_options.get("sampling_temperature", 1.0)
        )
    )


@dataclass(frozen=True)
class DecodingOptions:
    """The ``generate()`` options (``beam_size=1``) that decide the output, checked once.

    ``sampling_topk`` and ``sampling_temperature`` mean what they mean to CTranslate2: with
    ``sampling_topk == 1`` or ``sampling_temperature == 0`` the choice is the argmax (greedy);
    otherwise each token is drawn from softmax(logits / temperature) over the ``sampling_topk``
    best tokens (0: all of them), after the same logit rules. ``num_hypotheses`` independent
    draws are returned best score first (sampling only).

    Raises:
        ValueError: a negative or non-finite temperature, a negative ``sampling_topk``, fewer
            than one hypothesis, or several hypotheses without sampling.
    """

    max_length: int = 448
    suppress_blank: bool = True
    suppress_tokens: Tuple[int, ...] = (-1,)
    max_initial_timestamp_index: int = 50
    length_penalty: float = 1.0
    sampling_topk: int = 1
    sampling_temperature: float = 1.0
    num_hypotheses: int = 1

    def __post_init__(self) -> None:
        if not (math.isfinite(self.sampling_temperature) and self.sampling_temperature >= 0):
            raise ValueError(f"sampling_temperature must be a finite number >= 0, got {self.sampling_temperature!r}")
        if self.sampling_topk < 0:
            raise ValueError(f"sampling_topk must be >= 0 (0: the full distribution), got {self.sampling_topk!r}")
        if self.num_hypotheses < 1:
            raise ValueError("The number of hypotheses must be > 0")  # CTranslate2's words
        if self.num_hypotheses > 1 and not self.sampling:
            raise ValueError("The number of hypotheses cannot be greater than beam_size * patience")  # idem

    @property
    def sampling(self) -> bool:
        """Whether tokens are drawn at random (CTranslate2's ``RandomSampler``), not the argmax."""
        return draws_at_random(self.sampling_topk, self.sampling_temperature)

    def generate_kwargs(self) -> dict:
        """The same decoding as CTranslate2 ``Whisper.generate`` keyword arguments."""
        return dict(
            beam_size=1,
            max_length=self.max_length,
            suppress_blank=self.suppress_blank,
            suppress_tokens=list(self.suppress_tokens),
            max_initial_timestamp_index=self.max_initial_timestamp_index,
            length_penalty=self.length_penalty,
            sampling_topk=self.sampling_topk,
            sampling_temperature=self.sampling_temperature,
            num_hypotheses=self.num_hypotheses,
        )
