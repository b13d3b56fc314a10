"""``ct2-flash bench``: faster-whisper against ct2-flash on the same audio, in one process, and
what the scripts under ``bench/`` share.

- ``runner``: the timed, interleaved runs of ``ct2-flash bench``;
- ``measure``: timing one input, the whole path and the decode part;
- ``manifest``, ``speech_sets``: what to transcribe; real speech fetched from PyPI source
  distributions;
- ``drafters``: the drafter a system runs, with its options;
- ``stock``, ``stock_worker``: the baseline, faster-whisper on stock ctranslate2 in another
  process;
- ``clients``: real faster-whisper clients driven as their users run them;
- ``replay``: ``ct2-flash stream``'s replay of a recording as a live stream;
- ``analysis``: bootstrap intervals, duration buckets, WER;
- ``plots``: the figures;
- ``machine``: the CPU and versions a figure came from;
- ``scripts``: what every script under ``bench/`` shares (timing, writing a result).
"""
