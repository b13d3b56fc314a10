"""Drafters: what proposes the tokens the loop verifies, behind one interface, chosen by one
registry.

- ``base``: the interface (``Drafter``, ``DraftWindow``, ``Proposal``);
- ``kinds``: the registry: which drafter a name, a directory or None opens (``open_drafter``,
  ``load_drafter``);
- ``prompt_lookup``: the built-in zero-cost drafter (``PromptLookupDrafter``);
- ``hypothesis``: the previous hypothesis of a re-decode, and a decode's own repeats
  (``HypothesisDrafter``);
- ``reference``: the oracle and random drafters of the tests and of the loop's ceiling;
- ``onnx_drafter``: the trained Whisper-Flash round in ONNX Runtime (``OnnxDrafter``);
- ``flash_model``, ``flash_drafter``: the Whisper-Flash network and its round in PyTorch
  (``[train]``);
- ``files``: drafter directories' config, target identity and checks, without PyTorch;
- ``audio_window``: which encoder frames a trained drafter reads;
- ``round_options``: a trained drafter's round options and its confidence cut.
"""
