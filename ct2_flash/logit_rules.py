"""Logit rules that reproduce CTranslate2's greedy Whisper ``generate()`` one position at a time.

CTranslate2 edits the logits of every decoding step with a fixed chain of processors
(``src/decoding.cc`` ``make_logits_processors`` and ``src/models/whisper.cc``): suppressed
tokens, then the "begin" suppression at the first sampled position (``suppress_blank``), then
Whisper's timestamp rules. The chosen token is the argmax of the edited logits and the
sequence score adds the log-softmax of the edited logits at the chosen token. We apply the
same chain to each verified row so that a row's choice is the token greedy ``generate()``
would have produced at that position, given the tokens before it.

Vocabulary of the sequences here: ``generated`` holds every token produced after the decoder
start token, forced prefix tokens included (CTranslate2's ``alive_seq``); a position's
``step`` is ``len(generated)`` and the first sampled position is ``sample_begin``
(the prefix length).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Tuple

import numpy as np

# CTranslate2 fills disabled logits with the lowest float; -inf gives the same argmax and
# log-softmax (exp of either is 0) and keeps the arithmetic obvious.
_DISABLED = -np.inf


@dataclass(frozen=True)
class SpecialTokens:
    """Ids of Whisper's special tokens in one vocabulary (see CTranslate2 ``WhisperReplica``)."""

    eot: int
    sot: int
    sot_prev: int
    no_speech: int
    no_timestamps: int
    vocab_size: int

    @property
    def timestamp_begin(self) -> int:
        return self.no_timestamps + 1

    @property
    def timestamp_end(self) -> int:
        return self.vocab_size - 1

    @classmethod
    def from_vocabulary(cls, tokens: Sequence[str]) -> "SpecialTokens":
        index = {token: i for i, token in enumerate(tokens)}
        no_speech = index.get("<|nospeech|>", index.get("<|nocaptions|>"))
        missing = [
            name
            for name in ("<|endoftext|>", "<|startoftranscript|>", "<|startofprev|>", "<|notimestamps|>")
            if name not in index
        ]
        if missing or no_speech is None:
            raise ValueError(f"not a Whisper vocabulary: missing {missing or ['<|nospeech|>']}")
        return cls(
            eot=index["<|endoftext|>"],
            sot=index["<|startoftranscript|>"],
            sot_prev=index["<|startofprev|>"],
            no_speech=no_speech,
            no_timestamps=index["<|notimestamps|>"],
            vocab_size=len(tokens),
        )


@dataclass(frozen=True)
class LogitRules:
    """The processor chain of one ``generate()`` call.

    Args:
        special: special token ids.
        suppress_ids: ids disabled at every position (``suppress_tokens`` with ``-1`` expanded).
        suppress_begin_ids: ids disabled at the first sampled position (``suppress_blank``).
        timestamps: whether the timestamp rules apply (the prompt does not end with
            ``<|notimestamps|>``).
        max_initial_timestamp_id: the largest timestamp id allowed as the first token.
        sample_begin: number of forced prefix tokens before the first sampled position.
    """

    special: SpecialTokens
    suppress_ids: Tuple[int, ...]
    suppress_begin_ids: Tuple[int, ...]
    timestamps: bool
    max_initial_timestamp_id: int
    sample_begin: int

    def __post_init__(self) -> None:
        # Index arrays built once: this runs for every verified row.
        object.__setattr__(self, "_suppress", np.asarray(self.suppress_ids, dtype=np.int64))
        object.__setattr__(self, "_suppress_begin", np.asarray(self.suppress_begin_ids, dtype=np.int64))

    def apply(self, logits: np.ndarray, generated: Sequence[int]) -> float:
        """Edit the logits of the next position in place.

        Args:
            logits: [vocab] float32 raw logits of the position after ``generated``.
            generated: tokens produced so far (prefix included); ``len(generated)`` is the step.

        Returns:
            how far the one logit-dependent rule (timestamp mass against the best text token)
            was from deciding the other way, in log space; inf when it did not apply.
        """
        step = len(generated)
        logits[self._suppress] = _DISABLED
        if step == self.sample_begin:
            logits[self._suppress_begin] = _DISABLED
        if self.timestamps:
            return self._apply_timestamp_rules(logits, generated, step)
        return np.inf

    def _apply_timestamp_rules(self, logits: np.ndarray, generated: Sequence[int], step: int) -> float:
        special = self.special
        ts_begin = special.timestamp_begin
        logits[special.no_timestamps] = _DISABLED
        check_timestamp_mass = False
        if step == self.sample_begin == 0:
            # The first token is a timestamp, no later than max_initial_timestamp.
            logits[:ts_begin] = _DISABLED
            logits[self.max_initial_timestamp_id + 1 :] = _DISABLED
        elif step > self.sample_begin:
            last = generated[step - 1]
            if last >= ts_begin:
                penultimate = generated[step - 2] if step - 1 > self.sample_begin else last
                if penultimate >= ts_begin:
                    # Timestamps come in pairs: after a pair, text (or end) follows.
                    logits[ts_begin:] = _DISABLED
                else:
                    # A lone timestamp opens a pair: only a later timestamp or end-of-text.
                    logits[: special.eot] = _DISABLED
                    logits[ts_begin:last] = _DISABLED
                    check_timestamp_mass = True
            else:
                check_timestamp_mass = True
                # Timestamps never decrease.
                for token in reversed(generated[self.sample_begin : step]):
                    if token >= ts_begin:
                        logits[ts_begin : token + 1] = _DISABLED
                        break
        if check_timestamp_mass:
            # If the probability mass of all timestamps beats every single text token, the
            # next token must be a timestamp (compared in log space, as CTranslate2 does).
            text = logits[:ts_begin]
            timestamp_mass = _logsumexp(logits[ts_begin:])
            best_text = float(np.max(text))
            if timestamp_mass > best_text:
                text[:] = _DISABLED
            return abs(timestamp_mass - best_text) if np.isfinite(timestamp_mass - best_text) else np.inf
        return np.inf

    def choose(self, logits: np.ndarray, generated: Sequence[int]) -> Tuple[int, float, float]:
        """Apply the rules and pick greedily.

        Args:
            logits: [vocab] float32 raw logits; edited in place.
            generated: tokens produced so far.

        Returns:
            (token, log-probability of the token under the edited logits, margin): the margin
            is how close the choice came to going another way, in logits: the gap between the
            best and second-best edited logits, or the timestamp-mass rule's own gap if smaller.
        """
        margin = self.apply(logits, generated)
        token = int(np.argmax(logits))
        best = logits[token]
        logits[token] = _DISABLED
        runner_up = np.max(logits)
        logits[token] = best
        margin = min(margin, float(best - runner_up)) if np.isfinite(runner_up) else margin
        return token, float(best - _logsumexp(logits)), margin


def _logsumexp(values: np.ndarray) -> float:
    peak = np.max(values)
    if not np.isfinite(peak):
        return float(peak)
    return float(peak + np.log(np.sum(np.exp(values - peak))))

