"""The drafter a benchmark system runs: a name or a directory, plus its constructor's options.

Every drafter variant the project measures is one run of the one runner (``ct2-flash bench
--drafter SPEC --drafter-option KEY=VALUE ...``), so ``bench/run_all.sh`` regenerates every
committed result with it: the oracle ceiling (``oracle``, ``error_rate=0.1`` for one that is
wrong at one token in ten), the exported round's precisions and cuts (``precision=float32``,
``min_confidence=0``, ``audio_window=none``), the PyTorch round's tricks (``runtime=pytorch``,
``precision=bfloat16``, ``use_shortlist=false``) and checkpoints compared at default settings.

Specs are what ``drafting.kinds.open_drafter`` takes (the one registry):
    None: the model's shipped drafter (or ``PromptLookupDrafter`` when it has none);
    "builtin": ``PromptLookupDrafter``;
    "oracle": ``drafting.reference.OracleDrafter`` on a copy of the target (its own greedy output);
    a directory: a converted drafter (``OnnxDrafter``) or a training checkpoint (``FlashDrafter``,
        also chosen for a converted one with the option ``runtime=pytorch``).
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from ct2_flash.drafting.kinds import NAMED, ORACLE, open_drafter

__all__ = ["ORACLE", "build_drafter", "parse_option"]


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
    """The drafter for ``FlashWhisperModel(drafter=...)``: ``spec`` itself where it names no
    drafter in ``NAMED`` and there are no options (the model resolves it as users' code does),
    otherwise the drafter the one registry builds (``drafting.kinds.open_drafter``). The oracle
    gets a CTranslate2 model of its own, loaded with the target's ``compute_type`` and
    ``threads``."""
    if not options and spec not in NAMED:
        return spec
    return open_drafter(spec, model_name, model_path, compute_type, options, threads)
