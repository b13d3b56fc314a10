"""Re-decodes: the windows a thread decoded last, found again by their audio.

A streaming client transcribes its whole buffer again every second or so as audio arrives, so
the window at the start of the buffer is decoded again with a second more audio at its end.
``RecentWindows`` keeps, per thread, the last few windows' fingerprints (their first second
of log-mel features) and emitted tokens; a new window whose first second is the same audio
finds its previous hypothesis, which ``drafting.hypothesis.HypothesisDrafter`` proposes. A
false match (two streams that start alike) only costs speed: every token is verified.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Deque, Optional, Sequence, Tuple

import numpy as np

# Mel frames compared (100 = 1 s): long enough that different audio differs.
FINGERPRINT_FRAMES = 100
# Windows remembered per thread: a 25 s buffer is one window; longer ones a few.
REMEMBERED = 4
# Log-mel values (Whisper's scale: about -1.5 to 1.5) closer than this are the same audio; the
# same samples give the same values up to the rounding of a longer buffer's transforms.
TOLERANCE = 1e-4


@dataclass(frozen=True)
class Fingerprint:
    """The first ``FINGERPRINT_FRAMES`` mel frames of a window and the window's floor.

    Attributes:
        head: [n_mels, frames] float32, a copy.
        floor: the window's smallest value. Whisper's features clamp every value to 8 (log10)
            below the loudest of the whole buffer, so new, louder audio at the end raises the
            floor of the same audio at the start: values under either floor are not compared.
    """

    head: np.ndarray
    floor: float

    @classmethod
    def of(cls, features: np.ndarray) -> "Fingerprint":
        """features: [n_mels, frames] of one window."""
        return cls(np.array(features[:, :FINGERPRINT_FRAMES], dtype=np.float32), float(np.min(features)))

    def same_audio(self, other: "Fingerprint") -> bool:
        if self.head.shape != other.head.shape:
            return False
        floor = max(self.floor, other.floor)
        return bool(np.allclose(np.maximum(self.head, floor), np.maximum(other.head, floor), rtol=0, atol=TOLERANCE))


def window_fingerprint(features) -> Optional[Fingerprint]:
    """The fingerprint of a one-row batch of features ([1, n_mels, frames]), None for a batch
    of several rows (their calls are not re-decodes of one stream) or features not readable on
    the host (a GPU StorageView)."""
    try:
        array = np.asarray(features)
    except (TypeError, ValueError, RuntimeError, AttributeError):  # not on the host
        return None
    if array.ndim != 3 or array.shape[0] != 1:
        return None
    return Fingerprint.of(array[0])


def remembered_tokens(tokens: Sequence[int], ended: bool, eot: int) -> Tuple[int, ...]:
    """What ``RecentWindows`` keeps of a decode: its tokens (forced prefix included), and the
    end of text when the decode ended there rather than at its length limit, since the next
    decode's end of text is offered as any other token."""
    return tuple(int(t) for t in tokens) + ((int(eot),) if ended else ())


class RecentWindows:
    """Per thread, the last ``REMEMBERED`` windows decoded: (fingerprint, tokens).

    Threads never see each other's windows: each client's buffer is its own stream.
    """

    def __init__(self, size: int = REMEMBERED) -> None:
        self.size = size
        self._local = threading.local()

    def _windows(self) -> Deque[Tuple[Fingerprint, Tuple[int, ...]]]:
        windows = getattr(self._local, "windows", None)
        if windows is None:
            windows = self._local.windows = deque(maxlen=self.size)
        return windows

    def recall(self, fingerprint: Fingerprint) -> Optional[Tuple[int, ...]]:
        """The tokens of the newest remembered window with the same audio at its start, or None."""
        for remembered, tokens in reversed(self._windows()):
            if remembered.same_audio(fingerprint):
                return tokens
        return None

    def remember(self, fingerprint: Fingerprint, tokens: Sequence[int]) -> None:
        """Keep ``tokens`` (after the start-of-transcript sequence, end of text included if the
        decode ended) as the hypothesis of the window ``fingerprint`` starts; it replaces an
        older one of the same audio."""
        windows = self._windows()
        for index, (remembered, _) in enumerate(windows):
            if remembered.same_audio(fingerprint):
                del windows[index]
                break
        windows.append((fingerprint, tuple(int(t) for t in tokens)))

    def clear(self) -> None:
        """Forget this thread's windows."""
        self._windows().clear()
