"""Check, once at import, that ``ctranslate2`` is the patched runtime ct2-flash needs.

Stock ctranslate2 and the patched fork (``ctranslate2-crisperwhisper``) install the same
module, and a later ``pip install faster-whisper`` can silently put stock files over the fork
while ``pip list`` still shows the fork. The only reliable test is the module itself: the fork
adds ``Whisper.forward_batch`` and ``WhisperDecoderState.truncate_to_step``.
"""

from __future__ import annotations

from types import ModuleType
from typing import Optional

from ct2_flash.engine.runtime_import import import_runtime

FIX_INSTRUCTIONS = """\
ct2-flash needs the patched CTranslate2 runtime (PyPI: ctranslate2-crisperwhisper==4.7.1.post3),
whose Whisper model has forward_batch() and a decoder state that can be rolled back.
The installed `ctranslate2` module {problem}.
This usually happens when stock ctranslate2 was installed over the fork (for example by
`pip install faster-whisper`). Fix it from the ct2-flash checkout with:

    pip uninstall -y ctranslate2 ctranslate2-crisperwhisper
    pip install ./packaging/ctranslate2      # metadata-only 'ctranslate2' that requires the fork
    pip install --force-reinstall --no-deps ctranslate2-crisperwhisper==4.7.1.post3

or simply rerun `bash scripts/install.sh`."""

REQUIRED_WHISPER_METHODS = ("prefill", "forward_step", "forward_batch")
REQUIRED_STATE_METHODS = ("truncate_to_step", "clone")


class RuntimeInstallError(ImportError):
    """The installed ctranslate2 is not the patched runtime."""


def missing_features(module: Optional[ModuleType]) -> Optional[str]:
    """Describe what the given ctranslate2 module lacks, or None if it is the patched runtime."""
    if module is None:
        return "cannot be imported"
    models = getattr(module, "models", None)
    whisper = getattr(models, "Whisper", None)
    state = getattr(models, "WhisperDecoderState", None)
    if whisper is None:
        return "has no ctranslate2.models.Whisper"
    missing = [f"Whisper.{name}" for name in REQUIRED_WHISPER_METHODS if not hasattr(whisper, name)]
    if state is None:
        missing.append("WhisperDecoderState")
    else:
        missing += [f"WhisperDecoderState.{n}" for n in REQUIRED_STATE_METHODS if not hasattr(state, n)]
    if missing:
        version = getattr(module, "__version__", "unknown")
        return f"(version {version}) lacks {', '.join(missing)}"
    return None


def require_patched_runtime(module: Optional[ModuleType] = None) -> ModuleType:
    """Return the ctranslate2 module, or raise RuntimeInstallError with the fix."""
    if module is None:
        try:
            module = import_runtime()
        except ImportError as error:  # a half-removed install
            raise RuntimeInstallError(FIX_INSTRUCTIONS.format(problem=f"cannot be imported ({error})")) from error
    problem = missing_features(module)
    if problem is not None:
        raise RuntimeInstallError(FIX_INSTRUCTIONS.format(problem=problem))
    return module
