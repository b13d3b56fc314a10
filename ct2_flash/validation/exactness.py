"""Compare the speculative loop with CTranslate2's own greedy decoding on one window.

The plain reference path for the fast one: CTranslate2 ``generate()`` gives the tokens, and a
single-step replay (``forward_step`` per token, the computation plain greedy performs) gives
the target's own edited logits at the first position where the two disagree. Its top-2 margin
tells whether a difference is an int8 rounding effect at an ambiguous position (small margin)
or a bug (large margin).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np

from ct2_flash.loop.decoding import SpeculativeDecoder
from ct2_flash.loop.options import DecodingOptions
from ct2_flash.loop.target import PromptLayout


@dataclass(frozen=True)
class WindowComparison:
    """Outcome of one window.

    Attributes:
        reference: tokens of CTranslate2's greedy ``generate()``.
        speculative: tokens of the speculative loop.
        first_difference: index of the first differing token, or None when identical.
        reference_margin: top-2 margin of the target's own edited logits at that index (single
            steps, as plain greedy computes them), or None when identical.
    """

    reference: List[int]
    speculative: List[int]
    first_difference: Optional[int]
    reference_margin: Optional[float]

    @property
    def identical(self) -> bool:
        return self.first_difference is None


def compare_window(
    decoder: SpeculativeDecoder, encoder_output, prompt: Sequence[int], options: DecodingOptions
) -> WindowComparison:
    """Decode one window both ways and locate the first difference.

    Args:
        decoder: the speculative decoder (its runtime's model also serves the reference).
        encoder_output: StorageView [1, frames, d_model].
        prompt: the full prompt.
        options: greedy options.
    """
    runtime = decoder.runtime
    generated = runtime.model.generate(encoder_output, [list(prompt)], **options.generate_kwargs())
    reference = list(generated[0].sequences_ids[0])
    speculative = decoder.decode(encoder_output, prompt, options).tokens
    first = next(
        (i for i, (a, b) in enumerate(zip(reference, speculative)) if a != b),
        None if len(reference) == len(speculative) else min(len(reference), len(speculative)),
    )
    margin = None
    if first is not None:
        margin = _reference_margin(decoder, encoder_output, list(prompt), reference, first, options)
    return WindowComparison(reference, speculative, first, margin)


def _reference_margin(decoder, encoder_output, prompt, reference, index, options) -> float:
    runtime = decoder.runtime
    rules = decoder.rules_for(prompt, options)
    layout = PromptLayout.of(prompt, runtime.special)
    prefix_length = layout.prefix_length
    prefill = runtime.start(encoder_output, prompt)
    logits = prefill.next_logits
    # `reference` includes the forced prefix; single steps through the generated part.
    for token in reference[prefix_length:index]:
        logits = prefill.sequence.verify([token])[0]
    edited = logits.copy()
    rules.apply(edited, reference[:index])
    top_two = np.sort(edited)[-2:]
    return float(top_two[1] - top_two[0])
