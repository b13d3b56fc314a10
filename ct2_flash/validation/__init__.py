"""Exactness checks against CTranslate2 and faster-whisper, for the tests and the bench (the
drafters they use live in ``drafting.reference``).

- ``exactness``: one window decoded by the loop against CTranslate2's greedy ``generate()``,
  with margins;
- ``fuzzing``: random ``transcribe()`` options and drafters against faster-whisper.
"""
