"""Whisper-Flash as a ``Drafter``: checkpoint files, target checks and the cached draft round.

A checkpoint is a directory with ``drafter.safetensors`` (weights) and ``drafter.json`` (the
``DrafterConfig``, which records the target it belongs to). Nothing is unpickled. Loading next
to a target whose vocabulary size, width, mel bins or tokenizer differ raises
``DrafterMismatchError`` naming each difference.

At run time the drafter keeps, per layer, the encoder keys/values of the window (computed once
in ``begin``) and the keys/values of the projected history, which only grow by the positions
the target kept and are cut back to the target's cache length after each round.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from .drafting import Drafter, DraftWindow, Proposal
from .flash_model import DrafterConfig, FlashDrafterModel, TargetIdentity

WEIGHTS_FILE = "drafter.safetensors"
CONFIG_FILE = "drafter.json"
# Buffers copied from the target at load time instead of being stored (they are the target's).
_TARGET_BUFFERS = ("token_embedding", "position_embedding")


class DrafterMismatchError(ValueError):
    """The drafter was trained for another target."""


class CheckpointError(ValueError):
    """The checkpoint directory is missing files or its contents are inconsistent."""


def target_identity(model_path: str, model_name: str) -> TargetIdentity:
    """Identify a CTranslate2 Whisper model directory for drafter compatibility checks."""
    from .ct2_weights import CT2ModelFile

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


def save_checkpoint(model: FlashDrafterModel, directory: str) -> None:
    """Write ``drafter.safetensors`` and ``drafter.json`` into ``directory``."""
    os.makedirs(directory, exist_ok=True)
    weights = {name: tensor.contiguous() for name, tensor in model.state_dict().items() if name not in _TARGET_BUFFERS}
    save_file(weights, os.path.join(directory, WEIGHTS_FILE))
    with open(os.path.join(directory, CONFIG_FILE), "w", encoding="utf-8") as stream:
        json.dump(model.config.to_json_dict(), stream, indent=2)


def load_checkpoint(directory: str, model_path: str) -> FlashDrafterModel:
    """Load a drafter for the target in ``model_path`` (its frozen buffers come from there).

    Raises:
        CheckpointError: missing, unreadable or inconsistent files.
        DrafterMismatchError: the drafter was trained for another target (checked before any
            weight is touched, so the error names the difference rather than a shape).
    """
    from .ct2_weights import CT2ModelFile

    config_path, weights_path = os.path.join(directory, CONFIG_FILE), os.path.join(directory, WEIGHTS_FILE)
    for path in (config_path, weights_path):
        if not os.path.isfile(path):
            raise CheckpointError(f"drafter checkpoint {directory!r} has no {os.path.basename(path)}")
    try:
        with open(config_path, encoding="utf-8") as stream:
            config = DrafterConfig.from_json_dict(json.load(stream))
    except (ValueError, TypeError, KeyError) as error:
        raise CheckpointError(f"{config_path} is not a valid drafter config: {error}") from error
    check_target(config, target_identity(model_path, os.path.basename(os.path.normpath(model_path))))
    model = FlashDrafterModel(config)
    try:
        weights = load_file(weights_path)
    except Exception as error:  # safetensors raises its own error types for corrupt files
        raise CheckpointError(f"{weights_path} cannot be read: {error}") from error
    expected = {name for name in model.state_dict() if name not in _TARGET_BUFFERS}
    missing, unknown = expected - set(weights), set(weights) - expected
    if missing or unknown:
        raise CheckpointError(f"{weights_path}: missing {sorted(missing)}, unexpected {sorted(unknown)}")
    for name, tensor in model.state_dict().items():
        if name in weights and weights[name].shape != tensor.shape:
            raise CheckpointError(f"{weights_path}: {name} has shape {tuple(weights[name].shape)}, expected {tuple(tensor.shape)}")
    model.init_from_target(CT2ModelFile(model_path))
    model.load_state_dict(weights, strict=False)
    model.eval()
    return model


class FlashDrafter(Drafter):
    """Drafts with a ``FlashDrafterModel``; caches encoder and history keys/values.

    Args:
        model: the network (its config's target must match the loaded target).
    """

    needs_states = True

    def __init__(self, model: FlashDrafterModel) -> None:
        self.model = model.eval()
        self.vocab_size = model.config.target.vocab_size
        self.num_draft_tokens = model.config.num_draft_tokens
        # The (shortlisted) output head, gathered once: per round it is the largest matmul.
        self._head = model.token_embedding[model.shortlist].T.contiguous()  # [d, shortlist]
        self._cross_kv = None
        self._history_kv: List[Tuple[torch.Tensor, torch.Tensor]] = []
        self._history_start = 0  # text position of history index 0
        self._cache_length = 0  # the target's cache length = the next anchor's position

    def begin(self, window: DraftWindow) -> None:
        with torch.inference_mode():
            encoder_output = torch.from_numpy(np.asarray(window.encoder_output, dtype=np.float32))[None]
            self._cross_kv = self.model.cross_kv(encoder_output)
        self._history_kv = []
        # The first states the controller hands over are those of the last prompt position.
        self._history_start = len(window.prompt) - 1
        self._cache_length = len(window.prompt)

    def advance(self, states: Optional[np.ndarray], cache_length: int) -> None:
        if states is None:
            return
        keep = cache_length - len(states) - self._history_start
        self._cache_length = cache_length
        with torch.inference_mode():
            positions = torch.arange(cache_length - len(states), cache_length)[None]
            projected = self.model.project_history(torch.from_numpy(np.asarray(states, dtype=np.float32))[None])
            new = self.model.history_kv(projected, positions)
            if self._history_kv:
                self._history_kv = [
                    (torch.cat([k[:, :keep], nk], dim=1), torch.cat([v[:, :keep], nv], dim=1))
                    for (k, v), (nk, nv) in zip(self._history_kv, new)
                ]
            else:
                self._history_kv = new

    def propose(self, generated: Sequence[int], num_tokens: int) -> Proposal:
        anchor_position = self._cache_length
        with torch.inference_mode():
            anchors = torch.tensor([[int(generated[-1])]])
            x, positions = self.model.embed_blocks(anchors, torch.tensor([[anchor_position]]))
            history = self._history_kv or [
                (torch.zeros(1, 0, k.shape[2], k.shape[3]), torch.zeros(1, 0, k.shape[2], k.shape[3]))
                for k, _ in self._cross_kv
            ]
            states = self.model.forward_blocks(x, positions, history, self._cross_kv)
            logits = states[0, 1 : 1 + num_tokens] @ self._head  # mask positions
            tokens = self.model.shortlist[logits.argmax(-1)]
        return Proposal(tokens=tuple(int(t) for t in tokens))
