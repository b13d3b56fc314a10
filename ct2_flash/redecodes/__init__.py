"""Re-decodes: a streaming client transcribes its growing buffer again every second, and the
previous hypothesis of the same audio drafts most of the new decode.

- ``memory``: the windows a thread decoded last, found again by their first second of audio
  (``RecentWindows``);
- ``hypothesis``: the drafter that offers a previous hypothesis, realigned after each
  mismatch, and a decode's own repeats (``HypothesisDrafter``).
"""
