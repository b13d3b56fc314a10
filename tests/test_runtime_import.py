"""``import ct2_flash`` imports neither the fork's converters and specs nor PyTorch
(``engine.runtime_import``), and the converters, read later, still use it; a float32 model
imports ONNX Runtime only when its loop first drafts (``drafting.onnx_drafter``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ct2_flash.engine.runtime_import import DeferredModule

from .conftest import ROOT, checkout_environment

# A fresh interpreter: this one imported faster_whisper, so ctranslate2 and torch, already.
FRESH_IMPORT = """
import sys
import numpy as np
import ct2_flash
assert "torch" not in sys.modules, "import ct2_flash imported torch"
deferred = [name for name in ("ctranslate2.converters", "ctranslate2.specs") if name in sys.modules]
assert not deferred, f"import ct2_flash imported {deferred}"
import ctranslate2
assert ctranslate2.converters.TransformersConverter.__name__ == "TransformersConverter"
from ctranslate2.specs import model_spec
assert model_spec.torch_is_available
variable = model_spec.NumpyVariable(np.ones(3, np.float32)).to("bfloat16")
import torch
assert sys.modules["torch"] is torch and type(torch) is type(sys), "a stand-in stayed in sys.modules"
assert isinstance(variable.tensor, torch.Tensor) and variable.dtype == "bfloat16", variable.dtype
print("ok")
"""


def test_the_runtime_imports_without_torch_and_its_converters_still_use_it():
    pytest.importorskip("torch")
    result = subprocess.run(
        [sys.executable, "-c", FRESH_IMPORT], env=checkout_environment(), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


# A float32 model with the shipped drafter; every call in the loop (adaptive=False).
DRAFTER_AT_FIRST_USE = """
import sys
from ct2_flash import FlashWhisperModel
from ct2_flash.drafting.onnx_drafter import OnnxDrafter
flash = FlashWhisperModel("tiny.en", compute_type="float32", adaptive=False)
assert isinstance(flash.drafter, OnnxDrafter)
assert "onnxruntime" not in sys.modules, "the model's construction imported ONNX Runtime"
list(flash.transcribe(sys.argv[1], beam_size=5)[0])
assert "onnxruntime" not in sys.modules, "beam search imported ONNX Runtime"
list(flash.transcribe(sys.argv[1], beam_size=1)[0])
assert "onnxruntime" in sys.modules and flash.spec_stats.proposed > 0
print("ok")
"""


def test_a_float32_model_imports_onnx_runtime_when_its_loop_first_drafts():
    sample = os.path.join(ROOT, "tests", "data", "clip04_slt.ogg")
    result = subprocess.run(
        [sys.executable, "-c", DRAFTER_AT_FIRST_USE, sample],
        env=checkout_environment(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_a_deferred_module_imports_the_real_one_at_its_first_read(tmp_path, monkeypatch):
    (tmp_path / "deferred_probe").mkdir()
    (tmp_path / "deferred_probe" / "__init__.py").write_text("VALUE = 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    stand_in = DeferredModule("deferred_probe")
    monkeypatch.setitem(sys.modules, "deferred_probe", stand_in)
    assert "VALUE" not in vars(stand_in)
    assert stand_in.VALUE == 7
    real = sys.modules["deferred_probe"]
    assert real is not stand_in and real.VALUE == 7
    assert stand_in.VALUE == 7  # later reads are forwarded too
