"""The drafter interface: what a drafter sees of a call (``DraftWindow``), what it proposes
(``Proposal``), and what it must do (``Drafter``).

A drafter proposes up to ``num_tokens`` tokens that follow the current anchor. It sees the
window's encoder output once per ``generate()`` call (``begin``), the tokens generated so far
(ending with the anchor), and, if it asks for them, the target's final decoder states at every
kept cache position (``advance``). Drafters never touch the target's cache: after each round
the controller tells them how long the cache now is and hands over the states of the positions
that were added, so a drafter with its own cache rolls back to the same length.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Optional, Protocol, Sequence, Tuple

import numpy as np

from ct2_flash.drafting.audio_window import PADDING_FRAMES_SEEN


class CallOptions(Protocol):
    """What a drafter may read of a call's decoding options (the loop's
    ``loop.options.DecodingOptions``, which this layer does not import)."""

    @property
    def sampling(self) -> bool:
        """Whether tokens are drawn at random rather than taken greedily."""


@dataclass(frozen=True)
class DraftWindow:
    """One ``generate()`` call as a drafter sees it.

    Attributes:
        encoder_output: [frames, d_model] float32 encoder output of the window.
        prompt: the full prompt (previous text, task tokens, forced prefix).
        options: the decoding options of the call (``CallOptions``).
        eot: the target's end-of-text id.
        audio_frames: how many leading encoder frames hold audio (the rest encode the zero
            padding up to 30 s), or None when unknown.
    """

    encoder_output: np.ndarray = field(repr=False)
    prompt: Tuple[int, ...]
    options: CallOptions
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
        return None  # a hook: nothing to open by default

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
        return None  # a hook: drafters that do not read the position ignore it

    def advance(self, states: Optional[np.ndarray], cache_length: int) -> None:
        """The target cache now holds ``cache_length`` positions.

        Args:
            states: [n, d_model] final decoder states of the last n positions (those added
                this round), or None when ``needs_states`` is False.
            cache_length: positions now in the target cache; a drafter with a cache of its own
                keeps exactly the positions before this length.
        """
        return None  # a hook: drafters without a cache of their own keep nothing
