"""Drafts from the previous hypothesis of the same audio.

Streaming clients (whisper_streaming, whisperlivekit, whisper-live, RealtimeSTT) call
``transcribe()`` on the whole audio buffer again every second or so as audio arrives. The new
decode of a window that starts with the same audio mostly says again what the previous one
said, but much less of it as a plain prefix (docs/measurements.md, "Re-decodes of growing
buffers"), since the last segment's end timestamp and the last word move as audio arrives
and the text after them comes back. So the previous hypothesis is offered from where the new
decode stands in it, found again after every mismatch (``realign``), as one long block the
loop verifies (``Drafter.offered``: it costs nothing to propose); where it has nothing (new
audio at the end, a passage said differently) the trained drafter proposes instead. Drafts
only decide speed: the target verifies every token.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from ct2_flash.drafting.base import Drafter, DraftWindow, Proposal
from ct2_flash.drafting.prompt_lookup import latest_occurrence

# Tokens of context matched when realigning: enough to tell repeated words apart, few enough
# that a changed word just before the anchor does not hide the rest of the hypothesis.
MAX_CONTEXT = 4
# A match on fewer tokens than that is taken only this close (in tokens) to where the text is
# thought to continue: one or two common tokens ("the", ".") match all over a hypothesis, and a
# block offered from a false match costs a long pass for nothing.
NEAR = 4
# A timestamp stands for any timestamp when matching (the same boundary moves as audio grows).
_ANY_TIMESTAMP = -1
# Where the previous hypothesis has nothing, the decode's own text is offered again once its
# last this-many tokens stood earlier in it: a decode that repeats itself (Whisper's loops on
# a window with little or no audio: "The water was worth every mile." until the length limit)
# says the same again, and a run this long rarely recurs in speech that does not.
REPEAT_CONTEXT = 6


# A prompt whose text ends in this many tokens said again and again, with a period of at most
# MAX_LOOP_PERIOD tokens (three times or more), ends in a loop (``ends_in_loop``).
LOOP_TOKENS = 30
MAX_LOOP_PERIOD = 10


def ends_in_loop(tokens: Sequence[int], text_end: int) -> bool:
    """Whether the text of ``tokens`` (those below ``text_end``, the end-of-text token: not
    timestamps or other special tokens) ends in a loop: its last ``LOOP_TOKENS`` text tokens
    are one unit of at most ``MAX_LOOP_PERIOD`` tokens said again and again ("aaaa", "a-a-a-",
    "Thank you. Thank you. ..."). faster-whisper passes the previous windows' text as the prompt,
    so a window after one that looped is given the loop, and mostly loops again.
    """
    text = [int(t) for t in tokens if t < text_end]
    if len(text) < LOOP_TOKENS:
        return False
    tail = text[-LOOP_TOKENS:]
    return any(
        all(tail[i] == tail[i + period] for i in range(LOOP_TOKENS - period))
        for period in range(1, MAX_LOOP_PERIOD + 1)
    )


def repeated(generated: Sequence[int], limit: int, context: int = REPEAT_CONTEXT) -> Tuple[int, ...]:
    """What follows ``generated`` if it repeats itself: where its last ``context`` tokens
    occurred before (the latest such place), the tokens since then, repeated with that period,
    up to ``limit`` tokens; nothing where they did not occur.

    Args:
        generated: [n] the decode's tokens so far (ending with the anchor).
        limit: the most tokens to offer.
        context: tokens that must match.
    Returns:
        [<= limit] the offered tokens.
    """
    n = len(generated)
    if limit <= 0 or n <= context:
        return ()
    start = latest_occurrence(generated, context)
    if start is None:
        return ()
    period = n - context - start  # the repeated unit is the last `period` tokens
    cycle = generated[n - period :]
    return tuple(int(cycle[j % period]) for j in range(limit))


def realign(
    previous: Sequence[int],
    generated: Sequence[int],
    timestamp_begin: int,
    expected: Optional[int] = None,
    max_context: int = MAX_CONTEXT,
) -> Optional[int]:
    """Where the text after ``generated`` continues in ``previous``, or None.

    The position j such that ``previous[j - k:j]`` equals the last k tokens of ``generated``
    for the largest k (up to ``max_context``) that matches, timestamps matching any timestamp;
    among several such j, the one nearest ``expected`` (default: as many tokens in as
    ``generated`` is, since both decodes start at the same audio). A match on the whole
    context (``max_context`` tokens, or all of ``generated`` where it is shorter) may lie
    anywhere; a shorter one only within ``NEAR`` tokens of ``expected``. A lone timestamp is
    too common to place the text by, except at the very start or next to ``expected``.

    Args:
        previous: [m] the previous decode's tokens (after the start-of-transcript sequence).
        generated: [n >= 1] this decode's tokens so far, ending with the anchor.
        timestamp_begin: the first timestamp token id.
        expected: the position in ``previous`` where the text is thought to continue.
    Returns:
        j in [1, m]: propose ``previous[j:]``; j == m means the previous decode ends there.
    """
    return _realign(_keys(previous, timestamp_begin), generated, timestamp_begin, expected, max_context)


def _keys(tokens: Sequence[int], timestamp_begin: int) -> List[int]:
    """``tokens`` with every timestamp as ``_ANY_TIMESTAMP``."""
    return [_ANY_TIMESTAMP if t >= timestamp_begin else t for t in tokens]


def _realign(
    key: Sequence[int], generated: Sequence[int], timestamp_begin: int, expected: Optional[int], max_context: int
) -> Optional[int]:
    """``realign`` on the previous hypothesis's keys (made once per window by the drafter)."""
    if not key or not generated:
        return None
    tail = _keys(generated[-max_context:], timestamp_begin)
    expected = len(generated) if expected is None else expected
    for size in range(min(len(tail), len(key)), 0, -1):
        pattern = tail[-size:]
        ends = [j for j in range(size, len(key) + 1) if key[j - size : j] == pattern]
        if size == 1 and pattern[0] == _ANY_TIMESTAMP and len(generated) > 1:
            # One timestamp alone matches every segment boundary: only the one where the text
            # is thought to be (a changed last word, then the boundary as before).
            ends = [j for j in ends if abs(j - expected) <= 1]
        elif size < len(tail):
            ends = [j for j in ends if abs(j - expected) <= NEAR]
        if ends:
            return min(ends, key=lambda j: (abs(j - expected), j))
    return None


class HypothesisDrafter(Drafter):
    """Offers the previous hypothesis of this window's audio, and where it has nothing the
    decode's own text where that repeats itself (``repeated``); ``fallback`` proposes.

    The fallback sees every window and every round (``begin``, ``advance``,
    ``observe_position``), so that its own cache is whole whenever it has to propose.

    Args:
        fallback: the drafter for what the previous hypothesis does not cover.
        timestamp_begin: the target's first timestamp token id.
        end_of_text: the target's end-of-text token id.
    """

    def __init__(self, fallback: Drafter, timestamp_begin: int, end_of_text: int) -> None:
        self.fallback = fallback
        self.timestamp_begin = int(timestamp_begin)
        self.end_of_text = int(end_of_text)
        self.vocab_size = fallback.vocab_size
        self.needs_states = fallback.needs_states
        self.wants_position = fallback.wants_position
        self.proposes_prefixes = fallback.proposes_prefixes
        self._next: Tuple[int, ...] = ()
        self._previous: Tuple[int, ...] = ()
        self._previous_keys: List[int] = []  # _keys(self._previous): matched every round
        self._cursor: Optional[Tuple[int, int]] = None  # (position in previous, len(generated) then)
        self._last_block: Tuple[int, ...] = ()  # offered when generated was self._cursor[1] long
        self._moved: Dict[int, int] = {}  # timestamp of the previous decode -> the one this decode chose
        self.offered_rounds = 0  # rounds that offered from it (for measurements)
        self.repeat_rounds = 0  # rounds that offered the decode's own repeated text

    def remember(self, previous: Optional[Sequence[int]]) -> None:
        """The previous hypothesis of the window the next ``begin`` starts (None: none), its
        tokens after the start-of-transcript sequence, end of text included if it ended."""
        self._next = tuple(int(t) for t in previous) if previous else ()

    def begin(self, window: DraftWindow) -> None:
        self._previous, self._next, self._cursor = self._next, (), None
        self._last_block, self._moved = (), {}
        self._previous_keys = _keys(self._previous, self.timestamp_begin)
        self.fallback.begin(window)

    def offered(self, generated: Sequence[int], limit: int) -> Tuple[int, ...]:
        """The previous hypothesis from where ``generated`` continues in it (up to ``limit``
        tokens), with every timestamp this decode already moved (``_note_moved``) replaced by
        where it moved to; where it has nothing, or runs out before ``limit`` without having
        ended (a ``generate()`` stopped early), ``generated`` and it repeated if they repeat
        themselves; otherwise nothing.

        A decode stopped early is offered again in the loop: where it was repeating itself, a
        block that stopped at its last token would leave the loop one token a round."""
        block = self._from_previous(generated, limit)
        if len(block) == limit or (block and block[-1] == self.end_of_text):
            return block
        more = repeated(tuple(generated) + block, limit - len(block))
        self.repeat_rounds += int(bool(more))
        return block + more

    def _from_previous(self, generated: Sequence[int], limit: int) -> Tuple[int, ...]:
        """``offered`` from the previous hypothesis alone."""
        if not self._previous:
            return ()
        self._note_moved(generated)
        expected = None
        if self._cursor is not None:
            position, length = self._cursor
            expected = position + len(generated) - length
        at = _realign(self._previous_keys, generated, self.timestamp_begin, expected, MAX_CONTEXT)
        if at is None or at >= len(self._previous):
            return ()
        self._cursor = (at, len(generated))
        self.offered_rounds += 1
        block = self._previous[at : at + limit]
        if self._moved:
            block = tuple(self._moved.get(t, t) for t in block)
        self._last_block = block
        return block

    def _note_moved(self, generated: Sequence[int]) -> None:
        """Where the last offered block was refused at a timestamp for another timestamp,
        remember the move: a segment's end and the next one's start are the same timestamp
        (``<|t|><|t|>``), so a boundary that moved is refused twice otherwise, and the end of
        the audio moves every timestamp that stood on it alike."""
        block, self._last_block = self._last_block, ()
        if not block:
            return
        start = self._cursor[1]
        for offset, offered in enumerate(block):
            if start + offset >= len(generated):
                return
            chosen = generated[start + offset]
            if chosen != offered:
                if offered >= self.timestamp_begin and chosen >= self.timestamp_begin:
                    self._moved[offered] = chosen
                return

    def propose(self, generated: Sequence[int], num_tokens: int) -> Proposal:
        return self.fallback.propose(generated, num_tokens)

    def observe_position(self, frame: int) -> None:
        self.fallback.observe_position(frame)

    def advance(self, states, cache_length: int) -> None:
        self.fallback.advance(states, cache_length)
