"""A streaming front end: commit what two consecutive transcriptions of a growing buffer agree on.

The policy is whisper_streaming's (its ``OnlineASRProcessor``), which whisperlivekit and others
took over: audio arrives in chunks and is appended to a buffer; every ``process_iter`` call
transcribes the whole buffer again (greedy, word timestamps, the committed text before the
buffer as the prompt) and commits the words the new hypothesis and the previous one start
alike (LocalAgreement-2); once the buffer is longer than ``trim_seconds``, it is cut at the end
of the last completed segment that was committed, so the buffer's start moves there.

Every call after the first re-decodes the same window with a second more audio at its end:
``FlashWhisperModel`` notices and drafts from its previous hypothesis (``redecodes``), so with
ct2-flash each iteration costs less, and commits exactly the same text. Any faster-whisper
``WhisperModel`` works here; the commit policy never looks at which.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from ct2_flash.adapter.audio import checked_audio

SAMPLE_RATE = 16000


@dataclass(frozen=True)
class Word:
    """A word with its times in the stream (seconds from its start)."""

    start: float
    end: float
    text: str


def text_of(words: Sequence[Word]) -> str:
    """The words joined as Whisper spells them (each carries its own leading space)."""
    return "".join(word.text for word in words).strip()


@dataclass(frozen=True)
class StreamOptions:
    """How the stream is transcribed and committed, checked once.

    Attributes:
        language: the language code, or None to detect it (English-only models need none).
        trim_seconds: a buffer longer than this is cut at the end of a committed segment.
        prompt_characters: the most characters of committed text given as the prompt.
        no_speech_threshold: words of segments more likely than this to hold no speech are
            left out (whisper_streaming's 0.9).
        transcribe_options: further ``transcribe()`` keyword arguments; ``beam_size`` defaults
            to 1 (greedy: the way ct2-flash decodes speculatively).
    """

    language: Optional[str] = None
    trim_seconds: float = 15.0
    prompt_characters: int = 200
    no_speech_threshold: float = 0.9
    transcribe_options: Dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.trim_seconds) and self.trim_seconds > 0):
            raise ValueError(f"trim_seconds must be a positive number of seconds, got {self.trim_seconds!r}")
        if self.prompt_characters < 0:
            raise ValueError(f"prompt_characters must be >= 0, got {self.prompt_characters!r}")
        reserved = {"initial_prompt", "word_timestamps", "language"} & set(self.transcribe_options)
        if reserved:
            raise ValueError(
                f"the stream sets {sorted(reserved)} itself; use StreamOptions(language=...) for the language"
            )

    def transcribe_kwargs(self, prompt: str) -> Dict[str, Any]:
        kwargs: Dict[str, Any] = dict(beam_size=1, condition_on_previous_text=True)
        kwargs.update(self.transcribe_options)
        kwargs.update(initial_prompt=prompt, word_timestamps=True, language=self.language)
        return kwargs


class Agreement:
    """LocalAgreement-2: commits the words two consecutive hypotheses start with alike.

    ``insert`` takes the newest hypothesis (stream times), less the words before the last
    committed one and less any of its first words that repeat the end of the committed text;
    ``flush`` commits its common start with the previous hypothesis and keeps the rest as the
    next comparison's previous one.
    """

    # Words starting this long before the last committed end may still be new (times move).
    OVERLAP_SECONDS = 0.1
    # A new hypothesis starting this close to the last committed end may repeat its last words.
    REPEAT_WINDOW_SECONDS = 1.0
    MAX_REPEATED_WORDS = 5

    def __init__(self) -> None:
        self.committed_in_buffer: List[Word] = []  # committed words still inside the audio buffer
        self.previous: List[Word] = []  # the uncommitted rest of the previous hypothesis
        self.new: List[Word] = []
        self.last_committed_end = 0.0

    def insert(self, words: Sequence[Word]) -> None:
        new = [word for word in words if word.start > self.last_committed_end - self.OVERLAP_SECONDS]
        if new and abs(new[0].start - self.last_committed_end) < self.REPEAT_WINDOW_SECONDS:
            # The hypothesis may say the last committed words again: drop the longest such repeat.
            most = min(len(self.committed_in_buffer), len(new), self.MAX_REPEATED_WORDS)
            for size in range(most, 0, -1):
                tail = [word.text.strip() for word in self.committed_in_buffer[-size:]]
                if tail == [word.text.strip() for word in new[:size]]:
                    new = new[size:]
                    break
        self.new = new

    def flush(self) -> List[Word]:
        committed: List[Word] = []
        while self.new and self.previous and self.new[0].text.strip() == self.previous[0].text.strip():
            committed.append(self.new.pop(0))
            self.previous.pop(0)
        if committed:
            self.last_committed_end = committed[-1].end
        self.previous, self.new = self.new, []
        self.committed_in_buffer.extend(committed)
        return committed

    def drop_committed_before(self, time: float) -> None:
        """Forget committed words that end by ``time`` (the buffer was cut there)."""
        self.committed_in_buffer = [word for word in self.committed_in_buffer if word.end > time]

    def uncommitted(self) -> List[Word]:
        return list(self.previous)


class OnlineProcessor:
    """Streams audio through a faster-whisper model with the LocalAgreement-2 commit policy.

    Args:
        model: a ``WhisperModel`` (``FlashWhisperModel`` or faster-whisper's own).
        options: ``StreamOptions``.

    ``insert_audio(chunk)`` appends audio; ``process_iter()`` transcribes the buffer and returns
    the newly committed words; ``finish()`` returns the words never committed (the end of the
    stream) and closes it. ``committed`` holds every committed word, in order.
    """

    def __init__(self, model, options: Optional[StreamOptions] = None) -> None:
        self.model = model
        self.options = options or StreamOptions()
        self.committed: List[Word] = []
        self.iterations = 0
        self._buffer = np.zeros(0, np.float32)
        self._offset = 0.0  # stream time of the buffer's first sample
        self._received = 0  # samples inserted in all
        self._agreement = Agreement()
        self._finished = False

    @property
    def buffer_seconds(self) -> float:
        return self._buffer.size / SAMPLE_RATE

    @property
    def received_seconds(self) -> float:
        return self._received / SAMPLE_RATE

    def insert_audio(self, chunk: np.ndarray, sampling_rate: int = SAMPLE_RATE) -> None:
        """Append ``chunk``: [samples] float32 or float64 in [-1, 1] at 16 kHz. An empty chunk
        changes nothing.

        Raises:
            ValueError: another sample rate, or a stream already finished; ``AudioError`` (a
                ValueError, ``audio.checked_audio``): more than one channel, integer samples,
                NaN or infinite values. Nothing is appended.
        """
        if self._finished:
            raise ValueError("the stream is finished: start a new OnlineProcessor for new audio")
        if sampling_rate != SAMPLE_RATE:
            raise ValueError(f"chunks must be sampled at {SAMPLE_RATE} Hz, got {sampling_rate} (resample them first)")
        # The checks transcribe() makes on a waveform (an array, never a path to decode here).
        samples = checked_audio(np.asarray(chunk), SAMPLE_RATE)
        self._buffer = np.concatenate([self._buffer, samples])
        self._received += samples.size

    def process_iter(self) -> List[Word]:
        """Transcribe the buffer; return the words committed by this iteration (maybe none)."""
        if self._finished:
            raise ValueError("the stream is finished")
        if not self._buffer.size:
            return []
        self.iterations += 1
        segments, _ = self.model.transcribe(self._buffer, **self.options.transcribe_kwargs(self._prompt()))
        segments = list(segments)
        words = [
            Word(word.start + self._offset, word.end + self._offset, word.word)
            for segment in segments
            if segment.no_speech_prob <= self.options.no_speech_threshold
            for word in (segment.words or ())
        ]
        self._agreement.insert(words)
        committed = self._agreement.flush()
        self.committed.extend(committed)
        if self.buffer_seconds > self.options.trim_seconds:
            self._trim_at_completed_segment([segment.end + self._offset for segment in segments])
        return committed

    def finish(self) -> List[Word]:
        """The words of the last hypothesis never committed; the stream then takes no more
        audio. A second call returns nothing."""
        if self._finished:
            return []
        self._finished = True
        rest = self._agreement.uncommitted()
        self.committed.extend(rest)
        return rest

    def _prompt(self) -> str:
        """Committed text before the buffer, its last ``prompt_characters`` characters in words."""
        before = [word.text for word in self.committed if word.end <= self._offset]
        kept: List[str] = []
        length = 0
        for text in reversed(before):
            if length + len(text) > self.options.prompt_characters:
                break
            kept.append(text)
            length += len(text)
        return "".join(reversed(kept)).strip()

    def _trim_at_completed_segment(self, segment_ends: List[float]) -> None:
        """Cut the buffer at the end of the last segment that ends by the last committed word
        (never the last segment: it may still grow)."""
        if not self.committed or len(segment_ends) < 2:
            return
        last_committed = self.committed[-1].end
        ends = segment_ends[:-1]
        while ends and ends[-1] > last_committed:
            ends.pop()
        if not ends or ends[-1] <= self._offset:
            return
        cut = ends[-1]
        self._agreement.drop_committed_before(cut)
        self._buffer = self._buffer[int(round((cut - self._offset) * SAMPLE_RATE)) :]
        self._offset = cut
