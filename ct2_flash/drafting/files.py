"""Drafter files without PyTorch: the config, the target a drafter belongs to, and the checks.

A drafter directory holds ``drafter.json`` (the ``DrafterConfig``, which records the target it
was trained for) next to its weights (``drafter.safetensors``) and, once converted, its ONNX
graphs (``export.json`` lists them). Everything here reads JSON and the target's files only,
so the runtime can check a drafter against the loaded model before any weight is touched and
without PyTorch installed.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from typing import Optional, Tuple

from ct2_flash.engine.model_files import CT2ModelFile

# The drafters shipped in the package, one folder per model (ct2_flash/drafters/<name>/).
SHIPPED_DRAFTERS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "drafters")

WEIGHTS_FILE = "drafter.safetensors"
CONFIG_FILE = "drafter.json"
# Written by ``ct2-flash adapt``: the one model and compute type the drafter was adapted for.
ADAPTED_FILE = "adapted.json"
# Bytes of model.bin read from each end for its fingerprint (all of a large model would take
# seconds at every load; two fine-tunes of one model differ throughout).
_FINGERPRINT_BYTES = 1 << 20


class DrafterMismatchError(ValueError):
    """The drafter was trained for another target."""


class CheckpointError(ValueError):
    """The checkpoint directory is missing files or its contents are inconsistent."""


@dataclass(frozen=True)
class TargetIdentity:
    """What a drafter was trained against; loading it next to another target fails."""

    model_name: str
    vocab_size: int
    d_model: int
    n_mels: int
    tokenizer_sha256: str


@dataclass(frozen=True)
class DrafterConfig:
    """Architecture of a drafter (stored as JSON next to its safetensors weights).

    Attributes:
        target: the target model it belongs to.
        num_layers / num_heads / ffn_dim: the drafter's blocks (copied from the target's).
        num_draft_tokens: K, mask positions per block.
        history_taps: which target states make up the history (only "final" exists today:
            the post-LayerNorm decoder state recovered from the logits).
        rope_base: RoPE frequency base.
        max_positions: the target's text context (positions are clamped to it).
        shortlist_size: size of the draft-head vocabulary shortlist, 0 for the full vocabulary.
        use_audio: cross-attention to the encoder output (off only for the ablation).
        use_history: attention to the target's decoder states (off only for the ablation).
        causal_blocks: each row of a block attends to the anchor and the rows before it, not
            the rows after, so a proposal of k < K tokens computes k rows and proposes exactly
            what the K-row proposal would at those positions. False (drafters trained before
            it existed): every row sees the whole block, and a proposal always computes K rows.
    """

    target: TargetIdentity
    num_layers: int = 2
    num_heads: int = 6
    ffn_dim: int = 1536
    num_draft_tokens: int = 8
    history_taps: Tuple[str, ...] = ("final",)
    rope_base: float = 10000.0
    max_positions: int = 448
    shortlist_size: int = 0
    use_audio: bool = True
    use_history: bool = True
    causal_blocks: bool = False

    def __post_init__(self) -> None:
        if self.target.d_model % self.num_heads:
            raise ValueError("d_model must be divisible by num_heads")
        if (self.target.d_model // self.num_heads) % 2:
            raise ValueError("RoPE needs an even head dimension")
        if self.history_taps != ("final",):
            raise ValueError(f"unsupported history taps {self.history_taps}; only ('final',) exists")
        if self.num_draft_tokens < 1 or self.num_layers < 1:
            raise ValueError("num_draft_tokens and num_layers must be >= 1")

    @property
    def d_model(self) -> int:
        return self.target.d_model

    @property
    def history_dim(self) -> int:
        return self.target.d_model * len(self.history_taps)

    def to_json_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json_dict(cls, data: dict) -> "DrafterConfig":
        data = dict(data)
        data["target"] = TargetIdentity(**data["target"])
        data["history_taps"] = tuple(data["history_taps"])
        return cls(**data)


def proposal_rows(config: DrafterConfig, num_tokens: int) -> int:
    """Mask rows a proposal of ``num_tokens`` drafts computes: as many (1 .. K) with causal
    blocks, otherwise all K (each row reads the whole block, so fewer rows would propose other
    tokens than the drafter was trained to)."""
    if not config.causal_blocks:
        return config.num_draft_tokens
    return max(1, min(num_tokens, config.num_draft_tokens))


def target_identity(model_path: str, model_name: str) -> TargetIdentity:
    """Identify a CTranslate2 Whisper model directory for drafter compatibility checks."""
    for name in ("tokenizer.json", "vocabulary.txt", "vocabulary.json"):
        path = os.path.join(model_path, name)
        if os.path.isfile(path):
            with open(path, "rb") as stream:
                digest = hashlib.sha256(stream.read()).hexdigest()
            break
    else:
        raise FileNotFoundError(f"no tokenizer or vocabulary file in {model_path}")
    weights = CT2ModelFile(model_path)
    vocab, d_model = weights["decoder/embeddings/weight"].shape
    n_mels = weights["encoder/conv1/weight"].shape[1]  # [d_model, n_mels, kernel]
    return TargetIdentity(
        model_name=model_name, vocab_size=int(vocab), d_model=int(d_model), n_mels=int(n_mels), tokenizer_sha256=digest
    )


def check_target(config: DrafterConfig, target: TargetIdentity) -> None:
    """Raise DrafterMismatchError listing every field in which the drafter's target differs."""
    fields = ("vocab_size", "d_model", "n_mels", "tokenizer_sha256")
    differences = [
        f"{name}: drafter {getattr(config.target, name)!r} vs model {getattr(target, name)!r}"
        for name in fields
        if getattr(config.target, name) != getattr(target, name)
    ]
    if differences:
        raise DrafterMismatchError(
            f"this drafter was trained for {config.target.model_name!r}, not for the loaded model "
            f"({target.model_name!r}): " + "; ".join(differences)
        )


def read_config(directory: str) -> DrafterConfig:
    """The ``DrafterConfig`` in ``directory/drafter.json``.

    Raises:
        CheckpointError: the file is missing or is not a valid config.
    """
    path = os.path.join(directory, CONFIG_FILE)
    if not os.path.isfile(path):
        raise CheckpointError(f"drafter checkpoint {directory!r} has no {CONFIG_FILE}")
    try:
        with open(path, encoding="utf-8") as stream:
            return DrafterConfig.from_json_dict(json.load(stream))
    except (ValueError, TypeError, KeyError) as error:
        raise CheckpointError(f"{path} is not a valid drafter config: {error}") from error


def model_fingerprint(model_path: str) -> str:
    """A SHA-256 over a CTranslate2 model's config, its weights' size and their first and last
    MiB: another model, or the same one converted at another quantization, differs."""
    digest = hashlib.sha256()
    config = os.path.join(model_path, "config.json")
    if os.path.isfile(config):
        with open(config, "rb") as stream:
            digest.update(stream.read())
    weights = os.path.join(model_path, "model.bin")
    size = os.path.getsize(weights)
    digest.update(str(size).encode())
    with open(weights, "rb") as stream:
        digest.update(stream.read(_FINGERPRINT_BYTES))
        stream.seek(max(0, size - _FINGERPRINT_BYTES))
        digest.update(stream.read(_FINGERPRINT_BYTES))
    return digest.hexdigest()


def write_adapted(directory: str, model_path: str, compute_type: str, details: dict) -> None:
    """Record in ``directory`` the model and compute type a drafter was adapted for."""
    record = {
        "model_path": os.path.abspath(model_path),
        "model_sha256": model_fingerprint(model_path),
        "compute_type": compute_type,
        **details,
    }
    with open(os.path.join(directory, ADAPTED_FILE), "w", encoding="utf-8") as stream:
        json.dump(record, stream, indent=1)


def check_adapted(directory: str, model_path: str, compute_type: Optional[str]) -> None:
    """Refuse an adapted drafter next to a model or compute type it was not adapted for (a
    drafter without ``adapted.json`` serves any model its config's target matches; a
    ``compute_type`` of None is not checked).

    Raises:
        DrafterMismatchError: another model or compute type; CheckpointError: an unreadable record.
    """
    path = os.path.join(directory, ADAPTED_FILE)
    if not os.path.isfile(path):
        return
    try:
        with open(path, encoding="utf-8") as stream:
            record = json.load(stream)
        wanted_model, wanted_type = record["model_sha256"], record["compute_type"]
    except (ValueError, KeyError, TypeError) as error:
        raise CheckpointError(f"{path} is not a valid adaptation record: {error}") from error
    if model_fingerprint(model_path) != wanted_model:
        raise DrafterMismatchError(
            f"the drafter in {directory} was adapted for the model in {record.get('model_path')!r}, not for the "
            f"loaded one in {model_path!r}: adapt one for this model (ct2-flash adapt --model {model_path})"
        )
    if compute_type is not None and compute_type != wanted_type:
        raise DrafterMismatchError(
            f"the drafter in {directory} was adapted at compute type {wanted_type!r} and the model runs at "
            f"{compute_type!r}: load the model with compute_type={wanted_type!r}, or adapt a drafter at this "
            f"compute type (ct2-flash adapt --compute-type ...)"
        )
