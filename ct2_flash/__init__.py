"""ct2-flash: exact speculative decoding for faster-whisper on a patched CTranslate2.

Importing the package checks that the installed ``ctranslate2`` is the patched runtime and
raises ``RuntimeInstallError`` with the fix when it is not.
"""

from ct2_flash.engine.runtime_check import RuntimeInstallError, require_patched_runtime

require_patched_runtime()

from ct2_flash.runtime.acceptance import Acceptance, greedy_accept, sample_accept  # noqa: E402
from ct2_flash.audio import AudioError  # noqa: E402
from ct2_flash.drafting.base import Drafter, DraftWindow, DecodingOptions, PromptLookupDrafter, Proposal  # noqa: E402
from ct2_flash.engine.models import UnknownModelError, available_models, resolve_model  # noqa: E402
from ct2_flash.runtime.stats import SpecStats  # noqa: E402
from ct2_flash.whisper_model import BatchedInferencePipeline, FlashWhisperModel  # noqa: E402

__all__ = [
    "Acceptance",
    "AudioError",
    "BatchedInferencePipeline",
    "Drafter",
    "DraftWindow",
    "FlashWhisperModel",
    "DecodingOptions",
    "PromptLookupDrafter",
    "Proposal",
    "RuntimeInstallError",
    "SpecStats",
    "UnknownModelError",
    "available_models",
    "greedy_accept",
    "sample_accept",
    "require_patched_runtime",
    "resolve_model",
]
__version__ = "0.1.0"
