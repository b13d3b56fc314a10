"""The drafter interface and the built-in zero-cost drafter.

A drafter proposes up to ``num_tokens`` tokens that follow the current anchor. It sees the
window's encoder output once per ``generate()`` call (``begin``), the tokens generated so far
(ending with the anchor), and, if it asks for them, the target's final decoder states at every
kept cache position (``advance``). Drafters never touch the target's cache: after each round
the controller tells them how long the cache now is and hands over the states of the positions
that were added, so a drafter with its own cache rolls back to the same length.
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass, field, replace
from typing import Optional, Sequence, Tuple

import numpy as np


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


# Encoder frames of padding a drafter still sees after the audio (50 = 1 s).
PADDING_FRAMES_SEEN = 50
# Encoder frames (20 ms each) a round reads before and after where the target reads.
AUDIO_WINDOW = (50, 150)
# The window moves in steps of this many frames, so that a drafter copies its slice of the
# audio keys/values again only when the target's reading position has moved on by a step.
WINDOW_STRIDE = 25


def audio_window_span(frame: int, frames: int, window: Tuple[int, int]) -> Tuple[int, int]:
    """The encoder frames [start, stop) a round reads when the target reads ``frame``.

    ``frames`` is how many the drafter has (``DraftWindow.drafter_audio``); ``window`` is
    (frames before, frames after). Shared by the runtime drafters and training, so that a
    drafter is trained on exactly the slices it will read.
    """
    before, after = window
    start = max(0, min(frame - before, frames - before - after)) // WINDOW_STRIDE * WINDOW_STRIDE
    return start, min(frames, start + before + after + WINDOW_STRIDE)


@dataclass(frozen=True)
class DraftWindow:
    """One ``generate()`` call as a drafter sees it.

    Attributes:
        encoder_output: [frames, d_model] float32 encoder output of the window.
        prompt: the full prompt (previous text, task tokens, forced prefix).
        options: the decoding options of the call.
        eot: the target's end-of-text id.
        audio_frames: how many leading encoder frames hold audio (the rest encode the zero
            padding up to 30 s), or None when unknown.
    """

    encoder_output: np.ndarray = field(repr=False)
    prompt: Tuple[int, ...]
    options: DecodingOptions
    eot: int
    audio_frames: Optional[int] = None

    def drafter_audio(self) -> np.ndarray:
        """[frames', d_model] the encoder frames a drafter reads: the audio and a second of the
        padding after it (where speech ends is a cue for end-of-text), not the rest.

        A short clip is mostly padding; cross-attention over it is most of a round's cost, and
        proposals only decide speed, never the output.
        """
        if self.audio_frames is None:
            return self.encoder_output
        return self.encoder_output[: min(len(self.encoder_output), self.audio_frames + PADDING_FRAMES_SEEN)]


@dataclass(frozen=True)
class Proposal:
    """Draft tokens for one round.

    Attributes:
        tokens: [n] proposed tokens, n <= the number asked for (may be empty).
        log_probs: [n] the drafter's log-probability of each proposed token given the ones
            before it, or empty when the drafter has no such estimate (prompt lookup).
        probs: [n, vocab] the drafter's probabilities for them, or None (greedy only).
        logits: [n, m] the drafter's logits at each position over the tokens ``vocabulary``
            names ([m] ids), or None: the distribution sampled decoding draws drafts from
            (after the target's logit rules and temperature; see ``SpeculativeDecoder``).
    """

    tokens: Tuple[int, ...]
    log_probs: Tuple[float, ...] = ()
    probs: Optional[np.ndarray] = None
    logits: Optional[np.ndarray] = None
    vocabulary: Optional[np.ndarray] = None


class Drafter(abc.ABC):
    """Proposes tokens for the target to verify.

    Attributes:
        vocab_size: size of the vocabulary the drafter was built for, or None if it works with
            any (checked against the target once, when the model is built).
        needs_states: whether ``advance`` should receive the target's decoder states (their
            recovery costs a little, so drafters that ignore them say so).
        wants_position: whether ``observe_position`` should receive where in the audio the
            target is reading (the loop then has the engine return its alignment attention).
        proposes_prefixes: whether a proposal of k tokens costs less than one of more and is
            their first k (then an adaptive loop asks for only the drafts likely to pay).
    """

    vocab_size: Optional[int] = None
    needs_states: bool = False
    wants_position: bool = False
    proposes_prefixes: bool = False

    def prepare(self) -> None:
        """Open what the drafter runs on, once, before its first window (the model calls it
        where the loop is about to run). ``CheckpointError`` where that cannot be done."""

    @abc.abstractmethod
    def begin(self, window: DraftWindow) -> None:
        """Start a new sequence on a new window (drop all per-sequence caches)."""

    @abc.abstractmethod
    def propose(self, generated: Sequence[int], num_tokens: int) -> Proposal:
        """Propose up to ``num_tokens`` tokens after ``generated`` (which ends with the anchor).

        Args:
            generated: tokens produced after the decoder start token, forced prefix included.
            num_tokens: the most tokens that can still be used (>= 1).
        """

    def offered(self, generated: Sequence[int], limit: int) -> Tuple[int, ...]:
        """Tokens known to follow ``generated`` without computing anything (up to ``limit``),
        such as a previous hypothesis of the same audio; the loop asks for them before
        ``propose`` and verifies them as one block, longer than K where that pays. None here.
        """
        return ()

    def observe_position(self, frame: int) -> None:
        """The encoder frame the target's alignment heads attended to most when it predicted
        the next anchor (called after each verification when ``wants_position``)."""

    def advance(self, states: Optional[np.ndarray], cache_length: int) -> None:
        """The target cache now holds ``cache_length`` positions.

        Args:
            states: [n, d_model] final decoder states of the last n positions (those added
                this round), or None when ``needs_states`` is False.
            cache_length: positions now in the target cache; a drafter with a cache of its own
                keeps exactly the positions before this length.
        """


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


def cut_by_confidence(proposal: Proposal, min_confidence: float) -> Proposal:
    """The prefix of ``proposal`` whose joint drafter probability stays >= ``min_confidence``.

    An unlikely token rarely pays for its share of the verification; 0 keeps everything.
    """
    if min_confidence <= 0.0 or not proposal.log_probs:
        return proposal
    keep = int(np.sum(np.cumsum(proposal.log_probs) >= math.log(min_confidence)))
    return replace(
        proposal,
        tokens=proposal.tokens[:keep],
        log_probs=proposal.log_probs[:keep],
        logits=None if proposal.logits is None else proposal.logits[:keep],
    )


def check_audio_window(window: Optional[Tuple[int, int]]) -> Optional[Tuple[int, int]]:
    """``window`` as (int, int) when it is a valid (frames before, frames after), or None."""
    if window is None:
        return None
    if len(window) != 2 or min(window) < 0 or sum(window) < 1:
        raise ValueError(f"audio_window must be None or (frames before, frames after) >= 0, got {window!r}")
    return int(window[0]), int(window[1])


def check_round_options(precision: str, precisions: Sequence[str], min_confidence: float, threads: int) -> None:
    """The options every trained drafter's round takes, checked once at construction."""
    if precision not in precisions:
        raise ValueError(f"precision must be one of {tuple(precisions)}, got {precision!r}")
    if not 0.0 <= min_confidence < 1.0:
        raise ValueError("min_confidence must be in [0, 1)")
    if threads < 1:
        raise ValueError("threads must be >= 1")
