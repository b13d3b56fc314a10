"""ct2-flash under programs that build ``faster_whisper.WhisperModel`` themselves.

``install()`` replaces ``faster_whisper.WhisperModel`` (and ``BatchedInferencePipeline``) with
ct2-flash's, the way ``coverage run`` or ``opentelemetry-instrument`` wrap a program without
editing it: the package attribute, ``faster_whisper.transcribe.WhisperModel``, and every module
that already did ``from faster_whisper import WhisperModel`` are pointed at ``DropInWhisperModel``.
A program that looks the class up after ``install()`` gets ct2-flash wherever it looks. What
cannot be redirected is said in one warning: a class the program derived from faster-whisper's
before ``install()`` (Python fixed its base then), or a reference held somewhere other than a
module global.

``DropInWhisperModel`` is ``FlashWhisperModel`` with faster-whisper's constructor: a model name
resolves as faster-whisper resolves it (its hub cache, ``download_root``, ``local_files_only``),
except that the embedded models (``tiny.en``) never need the network. The options given to
``install()`` (drafter, number of draft tokens) apply to every model the program builds, and
every model's counters are kept for ``stats()``, which ``ct2-flash run --stats`` writes at exit.

``ct2-flash run`` (``ct2_flash.dropin.run``) calls ``install()`` before the program starts;
``ct2-flash hook`` (``ct2_flash_hook``) does it in programs started by others, when their
environment has ``CT2_FLASH=1``.
"""

from __future__ import annotations

import inspect
import logging
import os
import sys
import threading
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import faster_whisper
import faster_whisper.transcribe
from faster_whisper.utils import download_model

from ct2_flash.adapter.whisper_model import (
    BatchedInferencePipeline,
    FlashWhisperModel,
    WhisperModel,
    constructor_signature,
)
from ct2_flash.engine.models import UnknownModelError, available_models
from ct2_flash.loop.decoding import check_num_draft_tokens
from ct2_flash.loop.stats import SpecStats

logger = logging.getLogger("ct2_flash")

# faster-whisper's own classes, as ct2_flash.adapter.whisper_model imported them (before any install()).
ORIGINALS = {"WhisperModel": WhisperModel, "BatchedInferencePipeline": faster_whisper.BatchedInferencePipeline}


@dataclass(frozen=True)
class DropInOptions:
    """What ``install()`` sets for every model the program builds.

    Attributes:
        drafter: a drafter directory (``ct2-flash adapt``, ``convert-drafter``); None: the one
            shipped for the model, prompt lookup where none is.
        num_draft_tokens: K, the most tokens proposed per verification.
        model_options: other ``FlashWhisperModel`` arguments (``near_exact``, ``stock_engine``,
            ...); arguments the program passes win over these.
        program: the program's name, for the messages (which client option turns beam search
            off).
    """

    drafter: Optional[str] = None
    num_draft_tokens: int = 8
    model_options: Dict[str, Any] = field(default_factory=dict)
    program: Optional[str] = None

    def __post_init__(self) -> None:
        check_num_draft_tokens(self.num_draft_tokens)
        if self.drafter is not None and not os.path.isdir(self.drafter):
            raise FileNotFoundError(f"drafter directory {self.drafter!r} does not exist")
        # ct2-flash's own options (faster-whisper's are the program's to pass).
        allowed = {
            p.name
            for p in inspect.signature(FlashWhisperModel.__init__).parameters.values()
            if p.kind is inspect.Parameter.KEYWORD_ONLY
        }
        unknown = sorted(set(self.model_options) - allowed)
        if unknown:
            raise TypeError(f"FlashWhisperModel has no option(s) {unknown}; it takes {sorted(allowed)}")


# Where a client hard-codes or defaults to beam search, the option its user changes.
CLIENT_BEAM_OPTIONS = {
    "whisper-ctranslate2": "--beam_size 1",
    "wyoming-faster-whisper": "--beam-size 1",
    "faster-whisper-server": "transcribe_options: {beam_size: 1} in its --config file",
    "whisperlivekit": "none: its faster-whisper backend writes beam_size=5 into its transcribe() call",
}


@dataclass
class _State:
    """What ``install()`` changed, so that ``uninstall()`` can put it back, and the counters of
    the models built since."""

    options: DropInOptions
    replaced: List[Tuple[object, str, object]] = field(default_factory=list)  # (module, name, original)
    models: List[Tuple[str, str, SpecStats]] = field(default_factory=list)  # (model, compute type, counters)


_state: Optional[_State] = None
_lock = threading.Lock()


class DropInWhisperModel(FlashWhisperModel):
    """``faster_whisper.WhisperModel`` after ``install()``: faster-whisper's constructor
    (same arguments, same model resolution) building a ``FlashWhisperModel`` with the options
    ``install()`` was given. Arguments the program passes win over those options."""

    def __init__(self, model_size_or_path: str, *args, **kwargs) -> None:
        options = _state.options if _state is not None else DropInOptions()
        if kwargs.get("files"):
            raise ValueError(
                "ct2-flash: WhisperModel(files=...) (a model held in memory) is not supported under "
                "ct2-flash; save the model to a directory and pass its path, or run the program "
                "without ct2-flash"
            )
        bound = inspect.signature(WhisperModel.__init__).bind(self, model_size_or_path, *args, **kwargs).arguments
        path = resolve_like_faster_whisper(
            model_size_or_path,
            bound.get("download_root"),
            bound.get("local_files_only", False),
            bound.get("revision"),
            bound.get("use_auth_token"),
        )
        settings = dict(options.model_options, drafter=options.drafter, num_draft_tokens=options.num_draft_tokens)
        settings.update(kwargs)
        try:
            super().__init__(path, *args, **settings)
        except Exception as error:
            # The program sees the very exception (it may catch it); the log says who failed and what to try.
            logger.error(
                "ct2-flash: %s could not build WhisperModel(%r) under ct2-flash (%s: %s); check that plain "
                "faster-whisper loads it (run the program without ct2-flash), and that the drafter (%s) "
                "was made for this model",
                options.program or "the program",
                model_size_or_path,
                type(error).__name__,
                error,
                options.drafter or "the shipped one",
            )
            raise
        if options.program:
            # A console script's name, or the module of -m (underscores).
            hint = CLIENT_BEAM_OPTIONS.get(options.program.replace("_", "-"))
            if hint is not None:
                self.model.beam_search_hint = f" ({options.program}'s option for greedy decoding: {hint})"
        with _lock:
            if _state is not None:
                _state.models.append((model_size_or_path, self.model.compute_type, self.spec_stats))


# faster-whisper's constructor, model name required as there, and ct2-flash's options.
DropInWhisperModel.__init__.__signature__ = constructor_signature(
    DropInWhisperModel.__init__, FlashWhisperModel.__init__
)


def resolve_like_faster_whisper(
    name: str,
    download_root: Optional[str] = None,
    local_files_only: bool = False,
    revision: Optional[str] = None,
    use_auth_token: Any = None,
) -> str:
    """The model directory (or embedded name) for ``name``, as faster-whisper resolves it: a
    directory is itself, an embedded model is ct2-flash's copy (no network), anything else
    goes to faster-whisper's ``download_model`` (its cache first; ``local_files_only`` never
    downloads).

    Raises:
        UnknownModelError: faster-whisper could not find or fetch it either.
    """
    if os.path.isdir(name) or name in available_models():
        return name
    try:
        return download_model(
            name,
            local_files_only=local_files_only,
            cache_dir=download_root,
            revision=revision,
            use_auth_token=use_auth_token,
        )
    except Exception as error:  # huggingface_hub raises many types (offline, not found, auth)
        offline = ", ".join(available_models()) or "none"
        raise UnknownModelError(
            f"ct2-flash: model {name!r} is not a directory and faster-whisper could not find or download it "
            f"({type(error).__name__}: {error}). Pass the directory of a CTranslate2 Whisper model, or a model "
            f"available offline ({offline})."
        ) from error


def install(
    drafter: Optional[str] = None, num_draft_tokens: int = 8, program: Optional[str] = None, **model_options: Any
) -> None:
    """Make ``faster_whisper.WhisperModel`` ct2-flash's ``DropInWhisperModel`` in this
    process (and ``BatchedInferencePipeline`` ct2-flash's, which checks the audio first).

    Idempotent: a second call with the same options does nothing; with other options it
    applies them to the models built from then on. ``uninstall()`` puts faster-whisper's
    classes back.

    Args:
        drafter, num_draft_tokens, program, model_options: ``DropInOptions``.
    """
    global _state
    options = DropInOptions(drafter, num_draft_tokens, dict(model_options), program)
    with _lock:
        if _state is not None:
            _state.options = options
            return
        _state = _State(options)
        replacements = {
            WhisperModel: DropInWhisperModel,
            ORIGINALS["BatchedInferencePipeline"]: BatchedInferencePipeline,
        }
        for module in list(sys.modules.values()):
            if module is None or getattr(module, "__name__", "").startswith("ct2_flash"):
                continue  # ct2-flash's own modules keep faster-whisper's classes: they build on them
            namespace = getattr(module, "__dict__", None)
            if not isinstance(namespace, dict):
                continue
            for name, value in list(namespace.items()):
                replacement = _replacement(replacements, value)
                if replacement is not None:
                    setattr(module, name, replacement)
                    _state.replaced.append((module, name, value))
    _warn_subclasses()


def _replacement(replacements: Dict[type, type], value: object) -> Optional[type]:
    """ct2-flash's class for ``value`` when it is one of faster-whisper's, else None."""
    try:
        return replacements.get(value)  # type: ignore[call-overload]
    except Exception:  # unhashable module globals, or objects whose __hash__ fails
        return None


def _warn_subclasses() -> None:
    """One warning naming the program's classes derived from faster-whisper's before install()."""
    ours = {FlashWhisperModel, DropInWhisperModel, BatchedInferencePipeline}
    derived = [
        cls
        for original in ORIGINALS.values()
        for cls in original.__subclasses__()
        if cls not in ours and not cls.__module__.startswith("ct2_flash")
    ]
    if derived:
        names = ", ".join(f"{cls.__module__}.{cls.__qualname__}" for cls in derived)
        logger.warning(
            "ct2-flash: %s derive(s) from faster-whisper's classes and was defined before ct2-flash was "
            "installed, so its models decode without ct2-flash; install it before that module is "
            "imported (ct2-flash run, or ct2_flash.install() first)",
            names,
        )


def uninstall() -> None:
    """Put faster-whisper's classes back where ``install()`` replaced them (models already
    built keep decoding with ct2-flash). Does nothing when not installed."""
    global _state
    with _lock:
        if _state is None:
            return
        for module, name, original in reversed(_state.replaced):
            if getattr(module, name, None) is not original:
                setattr(module, name, original)
        _state = None


def installed() -> bool:
    """Whether ``install()`` is in effect."""
    return _state is not None


def stats() -> Dict[str, Any]:
    """What the models built since ``install()`` did, JSON-ready: per model its counters
    (``SpecStats``) and, over all models, rows decoded speculatively, rows sent to CTranslate2's
    ``generate()`` because speculation measured slower, calls passed to CTranslate2 unchanged
    (``unchanged_calls``: beam search, int8 without ``near_exact``, options the loop does not
    implement), and tokens per target call in the loop."""
    with _lock:
        models = list(_state.models) if _state is not None else []
    rows = []
    for name, compute_type, counters in models:
        entry = {"model": name, "compute_type": compute_type, "tokens_per_target_call": counters.tokens_per_call}
        entry.update({key: value for key, value in asdict(counters).items() if key != "calibration"})
        rows.append(entry)
    total = {
        key: sum(row[key] for row in rows)
        for key in (
            "rows_in_loop",
            "rows_in_generate",
            "unchanged_calls",
            "target_calls",
            "emitted",
            "proposed",
            "accepted",
        )
    }
    return {
        "models": rows,
        "speculative_rows": total["rows_in_loop"],
        "generate_rows": total["rows_in_generate"],
        "unchanged_calls": total["unchanged_calls"],
        "target_calls": total["target_calls"],
        "tokens_per_target_call": total["emitted"] / total["target_calls"] if total["target_calls"] else 0.0,
        "acceptance": total["accepted"] / total["proposed"] if total["proposed"] else 0.0,
    }
