"""Training pipeline of the Whisper-Flash drafter: corpus -> speech -> teacher data -> drafter.

Each step is resumable and writes into one data directory (``CT2_FLASH_DATA`` or
``~/.cache/ct2_flash/drafter_data``); run them with ``python -m ct2_flash.train STEP``.

- ``corpus``: English text from what Debian packages ship, plus templates;
- ``voices``, ``synth``: the offline voices, and speech synthesized with them;
- ``augment``: synthetic speech made to sound like users' recordings;
- ``extract``: what the frozen target does on each utterance (teacher data);
- ``fit``: training the drafter on it;
- ``export``: held-out utterances as a benchmark manifest;
- ``report``: the training report next to a drafter;
- ``step_lock``: one running copy per step and directory;
- ``adapt``, ``user_audio``: ``ct2-flash adapt``, and the user's recordings it reads.
"""
