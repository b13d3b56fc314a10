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

import contextlib
import copy
import json
import os
from typing import Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from ct2_flash.drafting.audio_window import audio_window_span, check_audio_window
from ct2_flash.drafting.base import Drafter, DraftWindow, Proposal
from ct2_flash.drafting.files import (  # noqa: F401 (re-exported)
    CONFIG_FILE,
    WEIGHTS_FILE,
    CheckpointError,
    DrafterMismatchError,
    check_target,
    proposal_rows,
    read_config,
    target_identity,
)
from ct2_flash.drafting.flash_model import FlashDrafterModel
from ct2_flash.drafting.round_options import check_round_options, cut_by_confidence
from ct2_flash.engine.model_files import CT2ModelFile

# Buffers copied from the target at load time instead of being stored (they are the target's).
_TARGET_BUFFERS = ("token_embedding", "position_embedding")


def save_checkpoint(model: FlashDrafterModel, directory: str, dtype: Optional[torch.dtype] = None) -> None:
    """Write ``drafter.safetensors`` and ``drafter.json`` into ``directory``.

    ``dtype`` (e.g. float16) stores floating-point weights smaller; loading casts them back
    to float32.
    """
    os.makedirs(directory, exist_ok=True)
    weights = {
        name: (tensor.to(dtype) if dtype is not None and tensor.is_floating_point() else tensor).contiguous()
        for name, tensor in model.state_dict().items()
        if name not in _TARGET_BUFFERS
    }
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
    weights_path = os.path.join(directory, WEIGHTS_FILE)
    config = read_config(directory)
    if not os.path.isfile(weights_path):
        raise CheckpointError(f"drafter checkpoint {directory!r} has no {WEIGHTS_FILE}")
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
            raise CheckpointError(
                f"{weights_path}: {name} has shape {tuple(weights[name].shape)}, expected {tuple(tensor.shape)}"
            )
    model.init_from_target(CT2ModelFile(model_path))
    model.load_state_dict(weights, strict=False)
    model.eval()
    return model


PRECISIONS = ("int8", "bfloat16", "float32")


def default_precision() -> str:
    """ "int8" where torch has a quantized CPU engine (x86 fbgemm, ARM qnnpack), else float32.

    A draft round multiplies ~9 rows by ~15 MB of weights, so it is bound by memory traffic,
    not arithmetic: int8 weights (with float32 activations) cut the linears and the draft head
    to about a third of their float32 time. bfloat16 helps less (its attention kernels copy).
    """
    engines = set(torch.backends.quantized.supported_engines) - {"none"}
    return "int8" if engines else "float32"


def bfloat16_is_fast() -> bool:
    """Whether oneDNN runs bfloat16 matmuls natively here (x86 AVX-512, ARM with BF16).

    Uses torch's own check (private, so any failure reads as "no").
    """
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def _quantized_copy(model: FlashDrafterModel, head_weight: torch.Tensor) -> Tuple[FlashDrafterModel, torch.nn.Module]:
    """A copy of ``model`` whose linears hold int8 weights, and the draft head likewise.

    Uses torch's dynamic quantisation (weights int8 per tensor, activations quantised per
    call); deprecated in favour of torchao but present and tested in the pinned torch 2.13.
    """
    import warnings

    head = torch.nn.Linear(head_weight.shape[1], head_weight.shape[0], bias=False)
    head.weight.data = head_weight.float().contiguous()
    quantized = copy.deepcopy(model).float()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the deprecation notice, once per load
        torch.ao.quantization.quantize_dynamic(quantized, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)
        head = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(head), {torch.nn.Linear}, dtype=torch.qint8)
    return quantized.eval(), head.eval()


class FlashDrafter(Drafter):
    """Drafts with a ``FlashDrafterModel``; caches encoder and history keys/values.

    Args:
        model: the network (its config's target must match the loaded target). It is never
            modified: other precisions work on a copy.
        precision: "int8" (int8 weights, float32 activations), "bfloat16" or "float32";
            default ``default_precision()``. Proposals are only suggestions, so precision
            changes speed and acceptance, never the output.
        min_confidence: stop the proposal at the first position where the product of the
            drafter's probabilities so far falls below this (0 proposes all K). An unlikely
            token rarely pays for its share of the verification: 0.1 cut proposals and
            verification time by a third or more on held-out speech while tokens per target
            call barely moved (docs/measurements.md, "Figures behind the code's constants").
        use_shortlist: score only the checkpoint's draft-head shortlist (False scores the
            whole vocabulary: slower, and only there to measure what the shortlist costs).
        threads: torch threads during the drafter's calls (restored afterwards). One is
            fastest next to CTranslate2's own threads: a round is too small to split, and a
            second torch pool competes with CTranslate2's for the same cores.
        bfloat16_keys: keep the window's encoder keys/values in bfloat16. The cross-attention
            reads all 1500 of them per layer every round, and half the bytes cut a round by
            about a quarter with the same proposals (docs/measurements.md, "Figures behind
            the code's constants").
            Default: with "bfloat16", and with "int8" where ``bfloat16_is_fast()``.
        audio_window: (frames before, frames after) the target's reading position that a
            round's cross-attention reads (``audio_window_span``, as ``OnnxDrafter`` does), or
            None (default) for all of the window's audio.
    """

    needs_states = True

    def __init__(
        self,
        model: FlashDrafterModel,
        precision: Optional[str] = None,
        min_confidence: float = 0.1,
        use_shortlist: bool = True,
        threads: int = 1,
        bfloat16_keys: Optional[bool] = None,
        audio_window: Optional[Tuple[int, int]] = None,
    ) -> None:
        precision = precision or default_precision()
        check_round_options(precision, PRECISIONS, min_confidence, threads)
        self.audio_window = check_audio_window(audio_window)
        self.wants_position = self.audio_window is not None and model.config.use_audio
        self.threads = threads
        self.precision = precision
        self.dtype = torch.bfloat16 if precision == "bfloat16" else torch.float32  # activations
        if bfloat16_keys is None:
            bfloat16_keys = precision == "bfloat16" or (precision == "int8" and bfloat16_is_fast())
        self.cross_dtype = torch.bfloat16 if bfloat16_keys else torch.float32  # encoder keys/values
        self.min_confidence = min_confidence
        # Without history (an ablation) the target's states are not worth recovering.
        self.needs_states = model.config.use_history
        self.vocab_size = model.config.target.vocab_size
        self.num_draft_tokens = model.config.num_draft_tokens
        self.proposes_prefixes = model.config.causal_blocks
        self._vocabulary = model.shortlist if use_shortlist else torch.arange(self.vocab_size)
        # The (shortlisted) output head, gathered once: per round it is the largest matmul.
        head_weight = model.token_embedding[self._vocabulary]  # [shortlist, d]
        if precision == "int8":
            self.model, self._head = _quantized_copy(model, head_weight)
        else:
            same = model.mask_embedding.dtype == self.dtype
            self.model = (model if same else copy.deepcopy(model).to(self.dtype)).eval()
            weight = head_weight.to(self.dtype).T.contiguous()  # [d, shortlist]
            self._head = lambda states: states @ weight
        self._cross_kv = None  # per layer keys, values [1, heads, frames, head_dim] of the window's audio
        self._read_kv = None  # the slice of them a round reads
        self._read_span = (-1, -1)
        self._empty_history: List[Tuple[torch.Tensor, torch.Tensor]] = []
        self._history_kv: List[Tuple[torch.Tensor, torch.Tensor]] = []
        self._history_start = 0  # text position of history index 0
        self._cache_length = 0  # the target's cache length = the next anchor's position

    @contextlib.contextmanager
    def _torch_threads(self) -> Iterator[None]:
        previous = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            yield
        finally:
            torch.set_num_threads(previous)

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.asarray(array, dtype=np.float32)).to(self.dtype)

    def begin(self, window: DraftWindow) -> None:
        with self._torch_threads(), torch.inference_mode():
            cross = self.model.cross_kv(self._tensor(window.drafter_audio())[None])
            self._cross_kv = [None if kv is None else tuple(t.to(self.cross_dtype) for t in kv) for kv in cross]
            self._read_kv = self._cross_kv
            self._read_span = (-1, -1)
            config = self.model.config
            empty = torch.zeros(1, 0, config.num_heads, config.d_model // config.num_heads, dtype=self.dtype)
            self._empty_history = [(empty, empty)] * config.num_layers
        self._history_kv = []
        # The first states the controller hands over are those of the last prompt position.
        self._history_start = len(window.prompt) - 1
        self._cache_length = len(window.prompt)

    def observe_position(self, frame: int) -> None:
        if self._cross_kv[0] is None:
            return
        span = audio_window_span(frame, self._cross_kv[0][0].shape[2], self.audio_window)
        if span != self._read_span:  # copied again only when the window moves
            self._read_kv = [tuple(t[:, :, span[0] : span[1]].contiguous() for t in kv) for kv in self._cross_kv]
            self._read_span = span

    def advance(self, states: Optional[np.ndarray], cache_length: int) -> None:
        if states is None:
            return
        keep = cache_length - len(states) - self._history_start
        self._cache_length = cache_length
        with self._torch_threads(), torch.inference_mode():
            positions = torch.arange(cache_length - len(states), cache_length)[None]
            projected = self.model.project_history(self._tensor(states)[None])
            new = self.model.history_kv(projected, positions)
            if self._history_kv:
                self._history_kv = [
                    (torch.cat([k[:, :keep], nk], dim=1), torch.cat([v[:, :keep], nv], dim=1))
                    for (k, v), (nk, nv) in zip(self._history_kv, new)
                ]
            else:
                self._history_kv = new

    def propose(self, generated: Sequence[int], num_tokens: int) -> Proposal:
        with self._torch_threads(), torch.inference_mode():
            anchors = torch.tensor([[int(generated[-1])]])
            x, positions = self.model.embed_blocks(anchors, torch.tensor([[self._cache_length]]))
            # The anchor and the mask rows asked for (all K without causal blocks, where later
            # rows change earlier ones); the exported graph computes the same.
            rows = 1 + proposal_rows(self.model.config, num_tokens)
            history = self._history_kv or self._empty_history
            mask = self.model.proposal_mask(history[0][0].shape[1], rows)
            states = self.model.forward_blocks(x[:, :rows], positions[:, :rows], history, self._read_kv, mask)
            logits = self._head(states[0, 1 : 1 + num_tokens]).float()  # mask positions: [n, shortlist]
            best, index = logits.max(-1)
            tokens = self._vocabulary[index].tolist()
            log_probs = (best - torch.logsumexp(logits, -1)).tolist()  # log p(best) per position
        proposal = Proposal(
            tokens=tuple(tokens), log_probs=tuple(log_probs), logits=logits.numpy(), vocabulary=self._vocabulary.numpy()
        )
        return cut_by_confidence(proposal, self.min_confidence)
