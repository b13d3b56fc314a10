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

from ct2_flash.loop.row_scores import log_softmax_at

# ``LogitRules.choose_block(..., until_mismatch=True)`` reads a block's first rows alone first:
# a round's first draft is accepted about half the time, its second about a third.
FIRST_ROWS = 2

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
        object.__setattr__(self, "_timestamp_ids", np.arange(self.special.timestamp_begin, self.special.vocab_size))

    def apply(self, logits: np.ndarray, generated: Sequence[int]) -> float:
        """Edit the logits of the next position in place: the block's rules on one row
        (``choose_block``).

        Args:
            logits: [vocab] float32 raw logits of the position after ``generated``.
            generated: tokens produced so far (prefix included); ``len(generated)`` is the step.

        Returns:
            how far the one logit-dependent rule (timestamp mass against the best text token)
            was from deciding the other way, in log space; inf when it did not apply.
        """
        facts = self._row_facts(generated, (), 1) if self.timestamps else None
        _, rule_margins = self._choose_rows(logits[None], len(generated), facts)
        return float(rule_margins[0])

    def choose(self, logits: np.ndarray, generated: Sequence[int]) -> Tuple[int, float, float]:
        """Apply the rules and pick greedily: ``choose_block`` on one row.

        Args:
            logits: [vocab] float32 raw logits; edited in place.
            generated: tokens produced so far.

        Returns:
            (token, log-probability of the token under the edited logits, margin): the margin
            is how close the choice came to going another way, in logits: the gap between the
            best and second-best edited logits, or the timestamp-mass rule's own gap if smaller.
        """
        choice = self.choose_block(logits[None], generated, ())
        token = int(choice.tokens[0])
        return token, float(choice.log_probs([token])[0]), float(choice.margins(1)[0])

    def choose_block(
        self, logits: np.ndarray, generated: Sequence[int], drafts: Sequence[int], until_mismatch: bool = False
    ) -> "BlockChoice":
        """``choose`` for every row of a verified block, as array operations over the block.

        The rules and the argmax run over the rows (one pass over the vocabulary); the margins
        and log-probabilities, which cost further passes, are computed by ``BlockChoice`` for
        the leading rows the round actually uses.

        Args:
            logits: [n + 1, vocab] float32 raw rows; edited in place. Row j is the position
                after ``generated`` and the first j drafts.
            generated: tokens produced so far (prefix included), ending with the anchor.
            drafts: [n] the draft tokens (only the first n are read).
            until_mismatch: greedy acceptance reads no row after the first one whose choice
                differs from its draft (or accepts end-of-text), so take the block in two
                chunks, the first ``FIRST_ROWS`` rows and the rest, and stop after the chunk
                that holds such a row; later rows stay raw and out of the result. Right after
                the pass every row read is a cache miss, and with about one draft accepted a
                round most blocks end in the first chunk.
        """
        rows = logits.shape[0]
        drafts = list(drafts[: rows - 1])
        facts = self._row_facts(generated, drafts, rows) if self.timestamps else None
        ends = [FIRST_ROWS, rows] if until_mismatch and rows > FIRST_ROWS else [rows]
        tokens, margins, start = [], [], 0
        for end in ends:
            chosen, rule_margins = self._choose_rows(
                logits[start:end], len(generated) + start, facts and [fact[start:end] for fact in facts]
            )
            tokens.append(chosen)
            margins.append(rule_margins)
            judged = [int(t) for t in chosen[: max(0, len(drafts) - start)]]
            if judged != drafts[start:end] or self.special.eot in judged:
                break
            start = end
        tokens, margins = (
            (tokens[0], margins[0]) if len(tokens) == 1 else (np.concatenate(tokens), np.concatenate(margins))
        )
        return BlockChoice(tokens=tokens, rule_margins=margins, edited=logits[: len(tokens)])

    def _choose_rows(self, logits: np.ndarray, first_step: int, facts):
        """The rules and the greedy choice on consecutive rows [r, vocab] (in place), the first
        of them at step ``first_step``; ``facts``: theirs from ``_row_facts`` (None without
        timestamps). Returns tokens [r] and rule margins [r]."""
        rows = logits.shape[0]
        logits[:, self._suppress] = _DISABLED
        begin_row = self.sample_begin - first_step
        if 0 <= begin_row < rows and self._suppress_begin.size:
            logits[begin_row, self._suppress_begin] = _DISABLED
        if facts is None:
            return logits.argmax(axis=1), np.full(rows, np.inf)
        return self._timestamp_rules_block(logits, *facts)

    def _row_facts(self, generated: Sequence[int], drafts: Sequence[int], rows: int):
        """What the timestamp rules disable in each row of a block, from the tokens before it: the lowest and highest timestamp id a row allows, the end of the text range
        it disables (0: none) and whether the timestamp-mass rule applies (four lists of
        ``rows`` scalars). A few scalars per row cost less in Python than the dozen tiny numpy
        calls (~2 us each) the same logic takes as vectors."""
        special, begin = self.special, self.sample_begin
        ts_begin = special.timestamp_begin
        start = len(generated)
        lowest = [ts_begin] * rows
        highest = [special.timestamp_end] * rows
        text_end = [0] * rows
        checked = [False] * rows
        latest = None  # the latest timestamp after the prefix (timestamps never decrease after it)
        for index in range(start - 1, begin - 1, -1):  # a few tokens back: timestamps come every few words
            if generated[index] >= ts_begin:
                latest = generated[index]
                break
        previous = generated[-1] if generated else None  # the token before the row
        for row in range(rows):
            step = start + row
            if row:
                before_previous, previous = previous, drafts[row - 1]
                if previous >= ts_begin and step - 1 >= begin:
                    latest = previous
            else:
                before_previous = generated[-2] if start >= 2 else None
            if step == begin == 0:  # the first token is a timestamp, no later than the maximum
                highest[row], text_end[row] = self.max_initial_timestamp_id, ts_begin
            elif step > begin:
                if previous >= ts_begin:
                    penultimate = before_previous if step - 1 > begin else previous
                    if penultimate >= ts_begin:  # after a pair: text or end
                        lowest[row] = special.vocab_size
                    else:  # a lone timestamp opens a pair: a later timestamp or end-of-text
                        lowest[row], text_end[row], checked[row] = previous, special.eot, True
                else:
                    checked[row] = True
                    if latest is not None:
                        lowest[row] = latest + 1
        return lowest, highest, text_end, checked

    def _timestamp_rules_block(self, logits: np.ndarray, lowest, highest, text_end, checked):
        """Whisper's timestamp rules on consecutive rows [r, vocab], in place, given their
        ``_row_facts``, and the argmax of each row: each edit is one array operation over the
        rows. The text part is read once: its argmax and maximum serve both the
        timestamp-mass rule and the choice.

        Returns:
            tokens [r], and the timestamp-mass rule's margin per row (inf where it did not
            apply).
        """
        special = self.special
        ts_begin = special.timestamp_begin
        rows = logits.shape[0]
        logits[:, special.no_timestamps] = _DISABLED
        timestamps = logits[:, ts_begin:]  # a view: [r, timestamps]
        timestamps[
            (self._timestamp_ids < np.asarray(lowest)[:, None]) | (self._timestamp_ids > np.asarray(highest)[:, None])
        ] = _DISABLED
        for end in set(text_end) - {0}:  # at most two groups: first-token rows, lone-timestamp rows
            logits[[row for row in range(rows) if text_end[row] == end], :end] = _DISABLED

        index = np.arange(rows)
        # The text part's argmax in one pass: a full-row argmax over the contiguous block is
        # cheaper than one over the strided text part, and it is the text argmax wherever it
        # lands in the text part; other rows look at their text part alone.
        best_text_token = logits.argmax(axis=1)
        for row in np.flatnonzero(best_text_token >= ts_begin):  # rare: a timestamp leads
            best_text_token[row] = logits[row, :ts_begin].argmax()
        best_text = logits[index, best_text_token]
        best_timestamp_token = timestamps.argmax(axis=1)
        best_timestamp = timestamps[index, best_timestamp_token]
        margins = np.full(rows, np.inf)
        if any(checked):
            # If the probability mass of all timestamps beats every single text token, the
            # next token must be a timestamp (compared in log space, as CTranslate2 does).
            checked = np.flatnonzero(checked)
            timestamp_mass = _logsumexp_rows(timestamps[checked], best_timestamp[checked])
            text_best = best_text[checked]
            with np.errstate(invalid="ignore"):
                gap = np.abs(timestamp_mass - text_best)
            margins[checked] = np.where(np.isfinite(gap), gap, np.inf)
            forced = checked[timestamp_mass > text_best]
            logits[forced, :ts_begin] = _DISABLED
            best_text[forced] = _DISABLED
        # np.argmax takes the first maximum, so the text part wins ties.
        chosen = np.where(best_text >= best_timestamp, best_text_token, ts_begin + best_timestamp_token)
        return chosen, margins


@dataclass(frozen=True)
class BlockChoice:
    """The target's greedy choice at every row of a verified block.

    Attributes:
        tokens: [n + 1] the argmax of each edited row.
        rule_margins: [n + 1] the timestamp-mass rule's margin per row (inf where it did not
            apply); ``margins`` adds the top-2 gap.
        edited: [n + 1, vocab] the rows after the rules.
    """

    tokens: np.ndarray
    rule_margins: np.ndarray
    edited: np.ndarray

    def margins(self, count: int) -> np.ndarray:
        """[count] how close the choice of each of the first ``count`` rows came to going
        another way, in logits (``LogitRules.choose``'s margin)."""
        rows, index = self.edited[:count], np.arange(count)
        chosen = self.tokens[:count]
        best = rows[index, chosen]
        rows[index, chosen] = _DISABLED
        runner_up = rows.max(axis=1)
        rows[index, chosen] = best
        gaps = np.where(np.isfinite(runner_up), best - runner_up, np.inf)
        return np.minimum(self.rule_margins[:count], gaps)

    def distribution(self, row: int, temperature: float, topk: int) -> np.ndarray:
        """[vocab] float64 probabilities CTranslate2's ``RandomSampler`` draws row ``row``'s
        token from (``sampling_distribution`` of the edited row)."""
        return sampling_distribution(self.edited[row], temperature, topk)

    def log_probs(self, tokens: Sequence[int]) -> np.ndarray:
        """[len(tokens)] log-probability of tokens[j] under edited row j (CTranslate2's score
        of a step: the log-softmax of the edited logits, at temperature 1 even when sampling)."""
        return log_softmax_at(self.edited[: len(tokens)], tokens)


def sampling_distribution(logits: np.ndarray, temperature: float, topk: int) -> np.ndarray:
    """[vocab] float64 softmax(logits / temperature) over the ``topk`` largest logits (0: all),
    as CTranslate2's ``RandomSampler`` samples; ``logits`` [vocab] float32 (edited by the rules,
    at least one finite)."""
    if 0 < topk < len(logits):
        kept = np.argpartition(-logits, topk - 1)[:topk]
        scaled = np.full(len(logits), -np.inf, dtype=np.float32)
        scaled[kept] = logits[kept] / np.float32(temperature)
    else:
        scaled = logits / np.float32(temperature)
    weights = np.exp(scaled - scaled.max()).astype(np.float64)
    return weights / weights.sum()


def draw(weights: np.ndarray, uniform: float) -> int:
    """The index the inverse CDF of ``weights`` ([vocab], >= 0, not all 0; normalised here)
    gives at ``uniform`` in [0, 1)."""
    cumulative = np.cumsum(weights, dtype=np.float64)
    index = int(np.searchsorted(cumulative, uniform * cumulative[-1], side="right"))
    # Rounding can put the point at the very end: take the last token with any weight.
    return index if index < len(weights) else int(np.flatnonzero(weights)[-1])


def _logsumexp_rows(values: np.ndarray, peaks: np.ndarray) -> np.ndarray:
    """log(sum(exp)) of each row of [rows, columns] -> [rows], given each row's maximum [rows],
    in the values' precision (float32 logits: as CTranslate2's own float32 log-softmax, and
    twice as fast as in float64); the sum is pairwise. Used on the 1,501 timestamp columns."""
    finite = np.isfinite(peaks)
    shifted = values - np.where(finite, peaks, 0).astype(values.dtype)[:, None]
    np.exp(shifted, out=shifted)
    with np.errstate(divide="ignore"):
        return np.where(finite, peaks + np.log(shifted.sum(axis=1)), peaks)
