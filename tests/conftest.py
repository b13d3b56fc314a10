"""Shared fixtures: the embedded tiny.en model, committed test speech, reference outputs.

Everything here is offline and CPU-only. Models are loaded once per session and compute type;
reference transcriptions from plain faster-whisper are computed once per option set.
"""

from __future__ import annotations

import functools
import glob
import os
import weakref
from typing import Dict, List, Tuple

import numpy as np
import pytest
from faster_whisper import WhisperModel, decode_audio

from ct2_flash import FlashWhisperModel, resolve_model

# In CI every test dependency is installed (.ci/run installs the [test] extra): a test that
# skips there for a missing module or model would hide a broken install, so it fails instead.
IN_CI = bool(os.environ.get("CI"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if IN_CI and report.skipped:
        report.outcome = "failed"
        report.longrepr = f"skipped in CI ({report.longrepr}): a test dependency is missing from the install"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    # A module-level pytest.importorskip skips at collection, before any test runs, so the hook
    # above never sees it: under CI that skip is a collection error instead.
    outcome = yield
    report = outcome.get_result()
    if IN_CI and report.skipped:
        reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped at collection in CI ({reason}): a test dependency is missing from the install"


DATA = os.path.join(os.path.dirname(__file__), "data")
CLIP_PATHS = sorted(glob.glob(os.path.join(DATA, "clip*.ogg")))
LONG_PATH = os.path.join(DATA, "long_multi_voice.ogg")
THREADS = 2
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def checkout_environment() -> Dict[str, str]:
    """This process's environment with this checkout first on ``PYTHONPATH``: a Python process
    started with it imports the ``ct2_flash`` under test, whatever the environment installed."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))


@pytest.fixture(scope="session")
def model_path() -> str:
    return resolve_model("tiny.en")


@pytest.fixture(scope="session")
def clips() -> Dict[str, np.ndarray]:
    """Name -> float32 16 kHz waveform: 14 clips of 2-25 s and one of 94 s."""
    audio = {os.path.basename(path): decode_audio(path) for path in CLIP_PATHS + [LONG_PATH]}
    assert len(audio) >= 13
    return audio


class ModelPair:
    """A plain faster-whisper model and a FlashWhisperModel on the same engine settings."""

    def __init__(self, path: str, compute_type: str) -> None:
        self.compute_type = compute_type
        self.baseline = WhisperModel(path, compute_type=compute_type, cpu_threads=THREADS)
        self.flash = FlashWhisperModel(path, stock_engine=False, compute_type=compute_type, cpu_threads=THREADS)
        self._references: Dict[Tuple, List] = {}

    def reference(self, name: str, audio: np.ndarray, **options) -> List:
        key = (name, tuple(sorted(options.items())))
        if key not in self._references:
            self._references[key] = segments_of(self.baseline, audio, **options)
        return self._references[key]


def segments_of(model, audio: np.ndarray, **options) -> List[tuple]:
    """Segments as comparable tuples: (tokens, start, end, text)."""
    segments, _ = model.transcribe(audio, **options)
    return [(tuple(s.tokens), s.start, s.end, s.text) for s in segments]


_PAIRS: Dict[str, ModelPair] = {}


# Every FlashWhisperModel the tests make, so that each test can start with none remembering a window.
_FLASH_MODELS: "weakref.WeakSet[FlashWhisperModel]" = weakref.WeakSet()
_make_flash = FlashWhisperModel.__init__


@functools.wraps(_make_flash)  # keeps the signature, which ct2_flash.dropin.swap reads
def _registered(self, *args, **kwargs):
    _make_flash(self, *args, **kwargs)
    _FLASH_MODELS.add(self)


FlashWhisperModel.__init__ = _registered


@pytest.fixture(autouse=True)
def first_decodes():
    """Each test starts with models that remember no window (``FlashWhisperModel(redecodes=...)``):
    a clip an earlier test decoded would otherwise be a re-decode, drafted from its previous
    hypothesis rather than by the drafter the test means to exercise."""
    for model in list(_FLASH_MODELS):
        model.forget_windows()
    yield


@pytest.fixture(scope="session", params=["float32", "int8"])
def pair(request, model_path) -> ModelPair:
    if request.param not in _PAIRS:
        _PAIRS[request.param] = ModelPair(model_path, request.param)
    return _PAIRS[request.param]


@pytest.fixture(scope="session")
def float32_pair(model_path) -> ModelPair:
    if "float32" not in _PAIRS:
        _PAIRS["float32"] = ModelPair(model_path, "float32")
    return _PAIRS["float32"]
