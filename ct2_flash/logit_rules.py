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


    def choose_block(self, logits: np.ndarray, generated: Sequence[int], drafts: Sequence[int]) -> "BlockChoice":
        """``choose`` for every row of a verified block, as array operations over the block.

        The rules and the argmax run over all rows (one pass over the vocabulary); the margins
        and log-probabilities, which cost further passes, are computed by ``BlockChoice`` for
        the leading rows the round actually uses.

        Args:
            logits: [n + 1, vocab] float32 raw rows; edited in place. Row j is the position
                after ``generated`` and the first j drafts.
            generated: tokens produced so far (prefix included), ending with the anchor.
            drafts: [n] the draft tokens (only the first n are read).
        """
        rows = logits.shape[0]
        sequence = np.asarray([*generated, *drafts[: rows - 1]], dtype=np.int64)
        steps = len(generated) + np.arange(rows)  # [n + 1]
        logits[:, self._suppress] = _DISABLED
        begin_rows = np.flatnonzero(steps == self.sample_begin)
        if begin_rows.size and self._suppress_begin.size:
            logits[np.ix_(begin_rows, self._suppress_begin)] = _DISABLED
        if not self.timestamps:
            return BlockChoice(tokens=logits.argmax(axis=1), rule_margins=np.full(rows, np.inf), edited=logits)
        tokens, rule_margins = self._timestamp_rules_block(logits, sequence, steps)
        return BlockChoice(tokens=tokens, rule_margins=rule_margins, edited=logits)

    def _timestamp_rules_block(self, logits: np.ndarray, sequence: np.ndarray, steps: np.ndarray):
        """``_apply_timestamp_rules`` on every row, in place, and the argmax of each row.

        Each row's branch is a boolean vector over rows; the ranges a branch disables are
        column masks over the timestamp part (1,501 columns) or slices of the text part. The
        text part is read once: its argmax and maximum serve both the timestamp-mass rule and
        the choice.

        Returns:
            tokens [n + 1], and the timestamp-mass rule's margin per row (inf where it did not
            apply).
        """
        special, begin = self.special, self.sample_begin
        ts_begin = special.timestamp_begin
        logits[:, special.no_timestamps] = _DISABLED
        first = (steps == begin) & (begin == 0)  # the first token is a timestamp
        later = steps > begin
        # Lookups are only read where ``later`` holds, where the index exists; elsewhere index
        # -1 reads the trailing -1 (the first row of a window has no token before it).
        tokens = np.append(sequence, -1)
        previous = steps - 1
        last = np.where(later, tokens[previous], -1)
        last_is_timestamp = last >= ts_begin
        penultimate = np.where(previous > begin, tokens[np.maximum(steps - 2, -1)], last)
        pair = last_is_timestamp & (penultimate >= ts_begin)  # after a pair: text or end
        lone = last_is_timestamp & ~pair  # a lone timestamp opens a pair
        text = later & ~last_is_timestamp
        # The latest timestamp in sequence[begin:step] (timestamps never decrease after it).
        positions = np.arange(len(tokens))
        latest = np.maximum.accumulate(np.where((tokens >= ts_begin) & (positions >= begin), positions, -1))
        latest_before = np.where(later, latest[previous], -1)
        latest_token = tokens[latest_before]  # -1 where there is none
        monotonic = text & (latest_before >= 0)

        timestamps = logits[:, ts_begin:]  # a view: [n + 1, timestamps]
        token_ids = np.arange(ts_begin, logits.shape[1])
        disabled = (pair[:, None]
                    | (first[:, None] & (token_ids > self.max_initial_timestamp_id))
                    | (lone[:, None] & (token_ids < last[:, None]))
                    | (monotonic[:, None] & (token_ids <= latest_token[:, None])))
        timestamps[disabled] = _DISABLED
        logits[np.flatnonzero(first), :ts_begin] = _DISABLED
        logits[np.flatnonzero(lone), : special.eot] = _DISABLED

        index = np.arange(len(steps))
        # The text part's argmax in one pass: a full-row argmax over the contiguous block is
        # cheaper than one over the strided text part, and it is the text argmax wherever it
        # lands in the text part; other rows look at their text part alone.
        best_text_token = logits.argmax(axis=1)
        for row in np.flatnonzero(best_text_token >= ts_begin):  # rare: a timestamp leads
            best_text_token[row] = logits[row, :ts_begin].argmax()
        best_text = logits[index, best_text_token]
        best_timestamp_token = timestamps.argmax(axis=1)
        best_timestamp = timestamps[index, best_timestamp_token]
        margins = np.full(len(steps), np.inf)
        checked = lone | text
        if checked.any():
            # If the probability mass of all timestamps beats every single text token, the
            # next token must be a timestamp (compared in log space, as in ``apply``).
            rows = np.flatnonzero(checked)
            timestamp_mass = _logsumexp_rows(timestamps[rows])
            text_best = best_text[rows]
            with np.errstate(invalid="ignore"):
                gap = np.abs(timestamp_mass - text_best)
            margins[rows] = np.where(np.isfinite(gap), gap, np.inf)
            forced = rows[timestamp_mass > text_best]
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
        count = len(tokens)
        rows = self.edited[:count]
        return rows[np.arange(count), np.asarray(tokens, dtype=np.int64)] - _logsumexp_rows(rows)


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


def _logsumexp_rows(values: np.ndarray) -> np.ndarray:
    """``_logsumexp`` of each row of [rows, columns] -> [rows], in the values' precision (float32
    logits: as CTranslate2's own float32 log-softmax, and twice as fast as in float64, which
    was a fifth of a round's bookkeeping); the sum is pairwise."""
    peak = values.max(axis=1)
    finite = np.isfinite(peak)
    shifted = values - np.where(finite, peak, 0).astype(values.dtype)[:, None]
    np.exp(shifted, out=shifted)
    with np.errstate(divide="ignore"):
        return np.where(finite, peak + np.log(shifted.sum(axis=1)), peak)


def _logsumexp(values: np.ndarray) -> float:
    peak = np.max(values)
    if not np.isfinite(peak):
        return float(peak)
    return float(peak + np.log(np.sum(np.exp(values - peak))))

