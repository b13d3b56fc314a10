"""ct2-flash: exact speculative decoding for faster-whisper on a patched CTranslate2.

Importing the package checks that the installed ``ctranslate2`` is the patched runtime and
raises ``RuntimeInstallError`` with the fix when it is not.
"""

from ct2_flash.engine.runtime_check import RuntimeInstallError, require_patched_runtime

require_patched_runtime()

from ct2_flash.adapter.audio import AudioError  # noqa: E402
from ct2_flash.adapter.whisper_model import BatchedInferencePipeline, FlashWhisperModel  # noqa: E402
from ct2_flash.drafting.base import Drafter, DraftWindow, Proposal  # noqa: E402
from ct2_flash.drafting.files import CheckpointError, DrafterMismatchError  # noqa: E402
from ct2_flash.drafting.kinds import load_drafter  # noqa: E402
from ct2_flash.drafting.prompt_lookup import PromptLookupDrafter  # noqa: E402
from ct2_flash.dropin.swap import install, uninstall  # noqa: E402
from ct2_flash.engine.models import UnknownModelError, available_models, resolve_model  # noqa: E402
from ct2_flash.jobs.collection import CollectionError, FileResult, transcribe_files  # noqa: E402
from ct2_flash.jobs.streaming import OnlineProcessor, StreamOptions  # noqa: E402
from ct2_flash.loop.decoding import Adaptive, SpeculativeDecoder  # noqa: E402
from ct2_flash.loop.options import DecodingOptions  # noqa: E402
from ct2_flash.loop.stats import SpecStats  # noqa: E402

# What users need: the model and its pipeline, the loop and its counters, drafters (the
# interface, the built-in one, the loader), models, the drop-in under programs that build
# faster-whisper's class themselves, whole collections of files, a streaming front end, and the
# errors they may meet.
__all__ = [
    "Adaptive",
    "AudioError",
    "BatchedInferencePipeline",
    "CheckpointError",
    "CollectionError",
    "DecodingOptions",
    "DraftWindow",
    "Drafter",
    "DrafterMismatchError",
    "FileResult",
    "FlashWhisperModel",
    "OnlineProcessor",
    "PromptLookupDrafter",
    "Proposal",
    "RuntimeInstallError",
    "SpecStats",
    "SpeculativeDecoder",
    "StreamOptions",
    "UnknownModelError",
    "available_models",
    "install",
    "load_drafter",
    "resolve_model",
    "transcribe_files",
    "uninstall",
]
__version__ = "0.1.0"
