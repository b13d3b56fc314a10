"""The drop-in: ct2-flash under programs that build faster-whisper's ``WhisperModel`` themselves.

- ``swap``: ``ct2_flash.install()`` / ``uninstall()`` (faster-whisper's classes become
  ct2-flash's) and the models' counters;
- ``run``: ``ct2-flash run -- PROGRAM`` (finds the program and runs it in this interpreter);
- ``hook``: what ``CT2_FLASH=1`` does once a program imports faster-whisper (the start-up
  hook itself is the top-level ``ct2_flash_hook``, since importing this package loads the
  runtime).
"""

from ct2_flash.dropin.swap import DropInWhisperModel, install, installed, stats, uninstall  # noqa: E402

__all__ = ["DropInWhisperModel", "install", "installed", "stats", "uninstall"]
