"""Training pipeline of the Whisper-Flash drafter: corpus -> speech -> teacher data -> drafter.

Each step is resumable and writes into one data directory (``CT2_FLASH_DATA`` or
``~/.cache/ct2_flash/drafter_data``); run them with ``python -m ct2_flash.train STEP``.
"""
