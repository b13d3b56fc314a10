"""Which encoder frames a trained drafter reads: the audio and a second of padding after it, and
in each round a window around where the target reads. Shared by the runtime drafters and
training, so that a drafter is trained on exactly the slices it will read."""

from __future__ import annotations

from typing import Optional, Tuple

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


def check_audio_window(window: Optional[Tuple[int, int]]) -> Optional[Tuple[int, int]]:
    """``window`` as (int, int) when it is a valid (frames before, frames after), or None."""
    if window is None:
        return None
    if len(window) != 2 or min(window) < 0 or sum(window) < 1:
        raise ValueError(f"audio_window must be None or (frames before, frames after) >= 0, got {window!r}")
    return int(window[0]), int(window[1])
