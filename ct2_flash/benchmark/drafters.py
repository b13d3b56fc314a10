"""The drafter a benchmark system runs: a name or a directory, plus its constructor's options.

Every drafter variant the project measures is one run of the one runner (``ct2-flash bench
--drafter SPEC --drafter-option KEY=VALUE ...``), so ``bench/run_all.sh`` regenerates every
committed result with it: the oracle ceiling (``oracle``, ``error_rate=0.1`` for one that is
wrong at one token in ten), the exported round's precisions and cuts (``precision=float32``,
``min_confidence=0``, ``audio_window=none``), the PyTorch round's tricks (``runtime=pytorch``,
``precision=bfloat16``, ``use_shortlist=false``) and checkpoints compared at default settings.

Specs:
    None: the model's shipped drafter (or ``PromptLookupDrafter`` when it has none);
    "builtin": ``PromptLookupDrafter``;
    "oracle": ``validation.drafters.OracleDrafter`` on a copy of the target (its own greedy output);
    a directory: a converted drafter (``OnnxDrafter``) or a training checkpoint (``FlashDrafter``,
        also chosen for a converted one with the option ``runtime=pytorch``).
"""

from __future__ import annotations

import inspect
import os
from typing import Any, Dict, Optional, Sequence, Tuple

from ct2_flash.drafting.base import PromptLookupDrafter
from ct2_flash.drafting.files import SHIPPED_DRAFTERS
from ct2_flash.engine.models import embedded_name

ORACLE = "oracle"
BUILTIN = "builtin"
RUNTIMES = ("onnx", "pytorch")


def parse_option(text: str) -> Tuple[str, Any]:
    """``KEY=VALUE`` from the command line -> (key, value): ``none`` is None, ``true``/``false``
    are booleans, numbers are numbers, ``a,b`` is a tuple of values, anything else a string."""
    key, separator, value = text.partition("=")
    if not separator or not key.strip():
        raise ValueError(f"a drafter option is KEY=VALUE, got {text!r}")
    return key.strip(), _value(value.strip())


def _value(text: str) -> Any:
    if "," in text:
        return tuple(_value(part.strip()) for part in text.split(","))
    lowered = text.lower()
    if lowered in ("none", "null"):
        return None
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _checked(kind, options: Dict[str, Any], skip: Sequence[str] = ()) -> Dict[str, Any]:
    """``options`` if ``kind``'s constructor takes every one of them (a clear error otherwise)."""
    accepted = [name for name in inspect.signature(kind.__init__).parameters if name not in ("self", *skip)]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(f"{kind.__name__} takes no option {', '.join(unknown)} (it takes {', '.join(accepted)})")
    return dict(options)


def build_drafter(
    spec: Optional[str],
    options: Dict[str, Any],
    model_name: str,
    model_path: str,
    compute_type: str = "default",
    threads: int = 0,
):
    """The drafter for ``FlashWhisperModel(drafter=...)``: ``spec`` itself when there are no
    options (the model resolves it as users' code does), otherwise the Drafter built with them.
    The oracle asks a CTranslate2 model of its own, loaded here with the target's
    ``compute_type`` and ``threads``, for the target's greedy output (the model runs it with
    ``adaptive=False``: it shows the loop's ceiling, so no call may go to ``generate()``)."""
    options = dict(options)
    # Each kind imports its own engine here: ONNX Runtime, PyTorch or a second CTranslate2
    # model load only for the drafter a run asks for.
    if spec == ORACLE:
        import ctranslate2

        from ct2_flash.validation.drafters import OracleDrafter

        reference = ctranslate2.models.Whisper(
            model_path, device="cpu", compute_type=compute_type, intra_threads=threads
        )
        return OracleDrafter(reference, **_checked(OracleDrafter, options, skip=("reference_model",)))
    if spec == BUILTIN:
        return PromptLookupDrafter(**_checked(PromptLookupDrafter, options))
    if not options:
        return spec
    from ct2_flash.drafting.onnx_drafter import OnnxDrafter, has_graphs

    directory = spec or os.path.join(SHIPPED_DRAFTERS, embedded_name(model_path) or model_name)
    if not os.path.isfile(os.path.join(directory, "drafter.json")):
        raise ValueError(
            f"drafter options {sorted(options)} need a Whisper-Flash drafter, and {directory!r} is not one"
        )
    runtime = options.pop("runtime", "onnx" if has_graphs(directory) else "pytorch")
    if runtime not in RUNTIMES:
        raise ValueError(f"runtime must be one of {RUNTIMES}, got {runtime!r}")
    if runtime == "onnx":
        return OnnxDrafter(directory, model_path, **_checked(OnnxDrafter, options, skip=("directory", "model_path")))
    from ct2_flash.drafting.flash_drafter import FlashDrafter, load_checkpoint

    return FlashDrafter(load_checkpoint(directory, model_path), **_checked(FlashDrafter, options, skip=("model",)))
