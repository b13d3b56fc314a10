"""Import the patched ``ctranslate2`` without importing PyTorch or Transformers.

The fork (4.7.1) imports its model converters and specs with ``import ctranslate2``, and those
run ``import torch`` (the specs, the Transformers converter) and ``import transformers`` (the
converter) wherever the packages are installed: in an environment with PyTorch, importing
ct2-flash took seconds and memory more than faster-whisper on stock ctranslate2 4.8.5, which
loads its converters on first use (the figures: docs/measurements.md, "Start-up").
Inference never needs either package.

So the first import of ``ctranslate2`` runs with stand-ins for the installed ones among them:
modules that import the real package at the first attribute anyone reads from them. The
fork's converters bind the stand-in and work unchanged (``torch_is_available`` is still True,
a ``torch.Tensor`` check imports PyTorch then); once ``ctranslate2`` is imported the stand-ins
leave ``sys.modules``, so every later ``import torch`` is the real one. A package that is not
installed gets no stand-in (its ``ImportError`` is the fork's usual path), nor one that is
imported already (nothing to save), nor any when ``ctranslate2`` was imported before
ct2-flash (by ``faster_whisper``, say: the cost is paid then).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from typing import Dict

# What the fork's converters and specs import at module level and inference never uses.
DEFERRED = ("torch", "transformers")


class DeferredModule(types.ModuleType):
    """Stands for the module of its name: the first attribute read imports the real one
    (leaving ``sys.modules`` first if it is still there) and every read is forwarded to it."""

    def __getattr__(self, attribute: str):
        name = self.__name__
        if sys.modules.get(name) is self:
            del sys.modules[name]
        return getattr(importlib.import_module(name), attribute)


def import_runtime() -> types.ModuleType:
    """``import ctranslate2``, with ``DEFERRED`` packages deferred if it is the first import.

    Raises:
        ImportError: as ``import ctranslate2`` does.
    """
    if "ctranslate2" in sys.modules:
        return importlib.import_module("ctranslate2")
    stand_ins: Dict[str, DeferredModule] = {
        name: DeferredModule(name) for name in DEFERRED
        if name not in sys.modules and importlib.util.find_spec(name) is not None}
    sys.modules.update(stand_ins)
    try:
        return importlib.import_module("ctranslate2")
    finally:
        for name, stand_in in stand_ins.items():
            if sys.modules.get(name) is stand_in:
                del sys.modules[name]
