"""Re-decodes: a streaming client transcribes its growing buffer again every second, and the
previous hypothesis of the same audio drafts most of the new decode (the drafter that offers it
is ``drafting.hypothesis.HypothesisDrafter``).

- ``memory``: the windows a thread decoded last, found again by their first second of audio
  (``RecentWindows``).
"""
