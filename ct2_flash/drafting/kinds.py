"""Which drafter a model decodes with: the one registry that ``FlashWhisperModel``, the command
line and the bench all resolve a drafter through.

A drafter is named one of four ways: a ``Drafter`` given as it is; a name in ``NAMED``
(``"builtin"``: prompt lookup; ``"oracle"``: the target's own greedy output, for tests and the
loop's ceiling); None, for the drafter shipped for the model (prompt lookup where none is); or a
directory, opened by the first kind of drafter directory that recognises it (``KINDS``: ONNX
graphs, a PyTorch checkpoint). The previous hypothesis of a re-decode
(``hypothesis.HypothesisDrafter``) is not chosen here: the adapter wraps whichever drafter this
gives around each re-decode.

Adding a drafter that needs no directory is one entry in ``NAMED``; adding a kind of drafter
directory is one entry in ``KINDS``.
"""

from __future__ import annotations

import inspect
import logging
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Sequence, Union

from ct2_flash.drafting.base import Drafter
from ct2_flash.drafting.files import SHIPPED_DRAFTERS, CheckpointError, check_adapted
from ct2_flash.drafting.prompt_lookup import PromptLookupDrafter
from ct2_flash.engine.models import embedded_name, resolve_model

logger = logging.getLogger("ct2_flash")


@dataclass(frozen=True)
class DrafterKind:
    """One kind of drafter directory.

    Attributes:
        name: how options and reports name it ("onnx", "pytorch").
        recognises: directory -> whether it holds a drafter of this kind.
        open: (directory, model_path, **options) -> the drafter, for the target at
            ``model_path``.
    """

    name: str
    recognises: Callable[[str], bool]
    open: Callable[..., Drafter]


def checked_options(kind: type, options: Dict[str, Any], skip: Sequence[str] = ()) -> Dict[str, Any]:
    """``options`` if ``kind``'s constructor takes every one of them (a clear error otherwise)."""
    accepted = [name for name in inspect.signature(kind.__init__).parameters if name not in ("self", *skip)]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(f"{kind.__name__} takes no option {', '.join(unknown)} (it takes {', '.join(accepted)})")
    return dict(options)


def _has_graphs(directory: str) -> bool:
    # Here: ONNX Runtime loads only for a model that has a drafter directory.
    from ct2_flash.drafting.onnx_drafter import has_graphs

    return has_graphs(directory)


def _open_onnx(directory: str, model_path: str, **options) -> Drafter:
    from ct2_flash.drafting.onnx_drafter import OnnxDrafter

    return OnnxDrafter(directory, model_path, **checked_options(OnnxDrafter, options, skip=("directory", "model_path")))


def _open_checkpoint(directory: str, model_path: str, **options) -> Drafter:
    """A training checkpoint not yet converted runs in PyTorch (the [train] extra), the slower
    reference implementation of the same round."""
    try:
        from ct2_flash.drafting.flash_drafter import FlashDrafter, load_checkpoint
    except ImportError:
        raise CheckpointError(
            f"drafter {directory!r} has no exported graphs and PyTorch is not installed to run it "
            f"as a checkpoint; convert it with: ct2-flash convert-drafter {directory} OUT "
            f"(pip install 'ct2-flash[train]')"
        ) from None
    if not _has_graphs(directory):  # not a converted drafter run in PyTorch on purpose (the bench's runtime=)
        logger.warning(
            "ct2-flash: drafter %s is an unconverted checkpoint and runs in PyTorch, which is slower; "
            "convert it with: ct2-flash convert-drafter %s OUT",
            directory,
            directory,
        )
    return FlashDrafter(
        load_checkpoint(directory, model_path), **checked_options(FlashDrafter, options, skip=("model",))
    )


def _builtin(model_path: str, compute_type: Optional[str], threads: int, **options) -> Drafter:
    return PromptLookupDrafter(**checked_options(PromptLookupDrafter, options))


def _oracle(model_path: str, compute_type: Optional[str], threads: int, **options) -> Drafter:
    """``reference.OracleDrafter`` on a CTranslate2 model of its own, at the target's compute
    type and threads: it proposes the target's greedy output (run it with ``adaptive=False``:
    it shows the loop's ceiling, so no call should go to ``generate()``)."""
    import ctranslate2  # here: a second model loads only for the oracle

    from ct2_flash.drafting.reference import OracleDrafter

    reference = ctranslate2.models.Whisper(
        model_path, device="cpu", compute_type=compute_type or "default", intra_threads=threads
    )
    return OracleDrafter(reference, **checked_options(OracleDrafter, options, skip=("reference_model",)))


BUILTIN, ORACLE = "builtin", "oracle"
# Drafters named rather than found in a directory: name -> (model_path, compute_type, threads,
# **options) -> the drafter.
NAMED: Dict[str, Callable[..., Drafter]] = {BUILTIN: _builtin, ORACLE: _oracle}

# Tried in order: a converted drafter (its ONNX graphs), else a training checkpoint.
KINDS = (
    DrafterKind("onnx", _has_graphs, _open_onnx),
    DrafterKind("pytorch", lambda directory: True, _open_checkpoint),
)


def kind_of(directory: str) -> DrafterKind:
    """The first kind in ``KINDS`` that recognises ``directory``."""
    return next(kind for kind in KINDS if kind.recognises(directory))


def kind_named(name: str) -> DrafterKind:
    """The kind called ``name``; ValueError naming the kinds there are otherwise."""
    for kind in KINDS:
        if kind.name == name:
            return kind
    raise ValueError(f"runtime must be one of {tuple(kind.name for kind in KINDS)}, got {name!r}")


def shipped_drafter(name: str, model_path: str) -> str:
    """The directory of the drafter shipped for a model (by its name, or the embedded model's
    directory given as a path); it holds a drafter only where ``drafter.json`` is there."""
    return os.path.join(SHIPPED_DRAFTERS, embedded_name(model_path) or name)


def open_drafter(
    drafter: Union[Drafter, str, None],
    name: str,
    model_path: str,
    compute_type: Optional[str] = None,
    options: Optional[Dict[str, Any]] = None,
    threads: int = 0,
) -> Drafter:
    """The drafter ``FlashWhisperModel(name, drafter=drafter)`` decodes with (``load_drafter``
    says what ``drafter`` may be); ``model_path`` is the resolved model directory.

    Args:
        options: options of the drafter's constructor (the bench's ``--drafter-option``), for
            a named drafter or a Whisper-Flash directory (``runtime=`` picks its kind by name).
        threads: a named drafter's engine threads (the oracle's model).
    """
    options = dict(options or {})
    if isinstance(drafter, Drafter):
        if options:
            raise ValueError(f"drafter options {sorted(options)} apply to a drafter built here, not to a given one")
        return drafter
    if isinstance(drafter, str) and drafter in NAMED:
        return NAMED[drafter](model_path, compute_type, threads, **options)
    if drafter is None:
        drafter = shipped_drafter(name, model_path)
        if not os.path.isfile(os.path.join(drafter, "drafter.json")):
            if options:
                raise ValueError(
                    f"drafter options {sorted(options)} need a Whisper-Flash drafter, and {name!r} has none shipped"
                )
            return PromptLookupDrafter()
    if not isinstance(drafter, str):
        raise TypeError(
            f"drafter must be a ct2_flash.Drafter, one of {sorted(NAMED)}, a checkpoint directory or None, "
            f"not {type(drafter).__name__}"
        )
    if not os.path.isdir(drafter):
        raise CheckpointError(f"drafter directory {drafter!r} does not exist")
    if options and not os.path.isfile(os.path.join(drafter, "drafter.json")):
        raise ValueError(f"drafter options {sorted(options)} need a Whisper-Flash drafter, and {drafter!r} is not one")
    check_adapted(drafter, model_path, compute_type)
    kind = kind_named(options.pop("runtime")) if "runtime" in options else kind_of(drafter)
    return kind.open(drafter, model_path, **options)


def load_drafter(
    drafter: Union[Drafter, str, None] = None, model: str = "tiny.en", compute_type: Optional[str] = None
) -> Drafter:
    """The drafter ``FlashWhisperModel(model, drafter=drafter)`` would decode with.

    Args:
        drafter: None for the drafter shipped for the model (prompt lookup where none is), a
            name in ``NAMED`` ("builtin", "oracle"), a converted drafter directory, an unconverted training checkpoint (PyTorch, slower),
            or a ``Drafter``, returned as it is.
        model: a model name (``available_models()``) or a CTranslate2 model directory.
        compute_type: the engine's compute type (``model.compute_type``) the drafter will serve;
            None does not check it.

    Raises:
        CheckpointError: the directory is missing or damaged.
        DrafterMismatchError: the drafter was made for another target, or adapted
            (``ct2-flash adapt``) for another model or compute type.
    """
    return open_drafter(drafter, model, resolve_model(model), compute_type)
