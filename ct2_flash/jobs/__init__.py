"""What the commands run over audio, on any ``WhisperModel``.

- ``collection``: whole collections of files, resumable, by one or more jobs or on Ray
  (``transcribe_files``, ``ct2-flash transcribe``);
- ``outputs``: txt, srt, vtt and json transcripts, each written whole or not at all;
- ``streaming``: LocalAgreement-2 over a growing buffer (``OnlineProcessor``, ``ct2-flash
  stream``).
"""
