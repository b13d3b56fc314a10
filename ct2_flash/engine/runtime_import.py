"""Import the patched ``ctranslate2`` without its model converters and specs.

The fork (4.7.1) imports its model converters and specs with ``import ctranslate2``. Inference
never uses them, and they cost a process that transcribes: they run ``import torch`` (the
specs, the Transformers converter) and ``import transformers`` (the converter) wherever those
are installed, which took seconds and memory more than faster-whisper on stock ctranslate2
4.8.5 (which loads its converters on first use), and without PyTorch their own modules still
lengthened ``import ct2_flash`` (docs/measurements.md, "Start-up").

So the first import of ``ctranslate2`` runs with stand-ins for ``ctranslate2.converters`` and
``ctranslate2.specs``: modules that import the real one at the first attribute anyone reads
from them. The package keeps the stand-ins as its attributes (``ctranslate2.converters.X``
imports the converters then, PyTorch with them where installed); once ``ctranslate2`` is
imported they leave ``sys.modules``, so every later ``import ctranslate2.specs...`` is the real
one. None is used when ``ctranslate2`` was imported before ct2-flash (by ``faster_whisper``,
say: the cost is paid then).
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Dict

# The fork's submodules that ``import ctranslate2`` imports and inference never uses.
DEFERRED = ("ctranslate2.converters", "ctranslate2.specs")


class DeferredModule(types.ModuleType):
    """Stands for the module of its name: the first attribute read imports the real one
    (leaving ``sys.modules`` first if it is still there) and every read is forwarded to it."""

    def __getattr__(self, attribute: str):
        name = self.__name__
        if sys.modules.get(name) is self:
            del sys.modules[name]
        return getattr(importlib.import_module(name), attribute)


def import_runtime() -> types.ModuleType:
    """``import ctranslate2``, with ``DEFERRED`` submodules deferred if it is the first import.

    Raises:
        ImportError: as ``import ctranslate2`` does.
    """
    if "ctranslate2" in sys.modules:
        return importlib.import_module("ctranslate2")
    stand_ins: Dict[str, DeferredModule] = {name: DeferredModule(name) for name in DEFERRED}
    sys.modules.update(stand_ins)
    try:
        return importlib.import_module("ctranslate2")
    finally:
        for name, stand_in in stand_ins.items():
            if sys.modules.get(name) is stand_in:
                del sys.modules[name]
