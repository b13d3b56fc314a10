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

import os
from typing import Any, Dict, Optional, Tuple

from ct2_flash.drafting.kinds import checked_options, kind_named, kind_of, shipped_drafter
from ct2_flash.drafting.prompt_lookup import PromptLookupDrafter

ORACLE = "oracle"
BUILTIN = "builtin"


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
        return OracleDrafter(reference, **checked_options(OracleDrafter, options, skip=("reference_model",)))
    if spec == BUILTIN:
        return PromptLookupDrafter(**checked_options(PromptLookupDrafter, options))
    if not options:
        return spec
    directory = spec or shipped_drafter(model_name, model_path)
    if not os.path.isfile(os.path.join(directory, "drafter.json")):
        raise ValueError(
            f"drafter options {sorted(options)} need a Whisper-Flash drafter, and {directory!r} is not one"
        )
    kind = kind_named(options.pop("runtime")) if "runtime" in options else kind_of(directory)
    return kind.open(directory, model_path, **options)
