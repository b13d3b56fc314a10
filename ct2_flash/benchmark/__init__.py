"""``ct2-flash bench``: faster-whisper against ct2-flash on the same audio, in one process.

Modules: ``manifest`` (what to transcribe), ``speech_sets`` (real speech fetched from PyPI
source distributions), ``drafters`` (the drafter a system runs, with its options),
``analysis`` (bootstrap intervals, duration buckets, WER), ``runner`` (the timed, interleaved
runs) and ``plots``.
"""
