"""The patched CTranslate2 runtime and the model files, below everything else.

- ``runtime_check``: the installed ``ctranslate2`` is the patched fork, or a clear error;
- ``runtime_import``: imports it without its converters (so without PyTorch);
- ``models``: which models exist offline (``resolve_model``, ``available_models``);
- ``model_files``: reads ``model.bin`` tensors by name, no weights loaded;
- ``deferred_model``: a patched model that loads at its first use;
- ``forks``: what a forked child does with its parent's models and worker.
"""
