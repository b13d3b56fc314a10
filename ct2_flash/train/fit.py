"""Train the drafter on teacher data, as Whisper-Flash describes.

- Labels are the target's greedy continuation (teacher tokens), not reference text.
- Up to 16 anchor blocks per utterance are packed into one pass; block n sees only history
  positions strictly before its anchor (``block_attention_mask``).
- Loss weight exp(-(j-1)/4) for draft position j = 1..K; next to the cross-entropy on the
  greedy token, ``kl_weight`` times the distillation loss on the target's top-16
  distribution at that position (renormalised over the drafter's shortlist).
- Each batch reads only the encoder frames that hold audio (plus one second of padding, as
  the runtime drafter does, ``DraftWindow.drafter_audio``): cross-attention over the padding of
  a short utterance was most of a step. Encoder outputs stay on disk until a batch needs them.
- Audio position: with ``audio_window``, each block's cross-attention reads only the frames
  the runtime drafter would read for it (``audio_window_span`` around the frame the target's
  alignment heads read when predicting the anchor; all of the audio for the first anchor,
  which no verification has placed yet). With ``anchor_weight`` > 0 (AnchorDraft), the last
  layer's cross-attention at each mask position is pulled towards the frame the target reads
  for that token: the loss is -log of the attention mass within ``ANCHOR_RADIUS`` frames of it.
- AdamW, linear warm-up, cosine decay, gradient clipping.
- Checkpoints are chosen by mean accepted length in the real cached loop on validation
  windows (``validate``), not by offline loss.

State is saved every ``save_every`` steps as safetensors + JSON (weights, optimizer moments,
step, best score, and the utterances the run trains on), so ``fit`` resumes where it stopped
and a resumed run draws the same batches: teacher data extracted after a run started joins a
new run (``--init`` from the old one's checkpoint), not the running one. Nothing is pickled.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
import zipfile
from dataclasses import asdict, dataclass, replace
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from ct2_flash.drafting.audio_window import AUDIO_WINDOW, PADDING_FRAMES_SEEN, audio_window_span, check_audio_window
from ct2_flash.drafting.flash_drafter import FlashDrafter, load_checkpoint, save_checkpoint, target_identity
from ct2_flash.drafting.flash_model import DrafterConfig, FlashDrafterModel, block_attention_mask
from ct2_flash.engine.model_files import CT2ModelFile

IGNORE = -100
# What reading a damaged teacher file raises (numpy's npz is a zip archive).
DAMAGED = (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile)


# What a run updates: every weight, or (for fine-tuning on little data) only the last block
# and the final norm, which feed the draft head.
TRAINED = ("all", "last-layer")


@dataclass(frozen=True)
class FitConfig:
    """Training hyper-parameters (checked once)."""

    steps: int = 3000
    batch_size: int = 8
    blocks_per_utterance: int = 16
    learning_rate: float = 3e-4
    warmup_steps: int = 150
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    clip_norm: float = 1.0
    kl_weight: float = 0.5
    anchor_weight: float = 0.1
    audio_window: Optional[Tuple[int, int]] = AUDIO_WINDOW
    validate_every: int = 250
    save_every: int = 50
    validation_windows: int = 48
    seed: int = 0
    trained: str = "all"
    bf16: bool = False

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1 or not 1 <= self.blocks_per_utterance <= 64:
            raise ValueError("steps, batch_size >= 1 and 1 <= blocks_per_utterance <= 64 required")
        if self.warmup_steps >= self.steps:
            raise ValueError("warmup_steps must be below steps")
        if self.kl_weight < 0 or self.anchor_weight < 0:
            raise ValueError("kl_weight and anchor_weight must be >= 0")
        if self.trained not in TRAINED:
            raise ValueError(f"trained must be one of {', '.join(TRAINED)}, not {self.trained!r}")
        object.__setattr__(self, "audio_window", check_audio_window(self.audio_window))


@dataclass
class Example:
    """One teacher utterance.

    Attributes:
        path: its ``teacher/<id>.npz``; the encoder output is read from it when a batch needs it.
        states: [n, d] target final states; states[i] is at text position len(prompt) - 1 + i.
        tokens: [n] the target's greedy tokens y_0 .. y_{n-1} (end-of-text last when reached).
        prompt: the prompt tokens.
        top_ids, top_log_probs: [n, top] the target's most likely tokens for y_i and their
            log-probabilities (None in teacher data extracted before they were stored).
        audio_frames: encoder frames holding audio (None: unknown, all frames are read).
        attended_frames: [n] the encoder frame the target's alignment heads read for y_i
            (None in teacher data extracted before they were stored).
    """

    path: str
    states: np.ndarray
    tokens: np.ndarray
    prompt: np.ndarray
    top_ids: Optional[np.ndarray] = None
    top_log_probs: Optional[np.ndarray] = None
    audio_frames: Optional[int] = None
    attended_frames: Optional[np.ndarray] = None

    @property
    def encoder_output(self) -> np.ndarray:
        """[frames, d] float16: all 1500 frames, or for training utterances extracted since
        they were cropped, only the ``drafter_frames`` the drafter reads."""
        with np.load(self.path) as data:
            return data["encoder_output"]


def teacher_ids(data_dir: str, split: str) -> List[str]:
    """The extracted utterances of ``split`` that have at least one label, in extraction order
    (each once, should the log name one twice)."""
    with open(os.path.join(data_dir, "teacher.jsonl"), encoding="utf-8") as stream:
        ids = [r["id"] for r in map(json.loads, stream) if r["split"] == split and r["tokens"] >= 2]
    return list(dict.fromkeys(ids))


def load_examples(
    data_dir: str, split: str, limit: Optional[int] = None, ids: Optional[Sequence[str]] = None
) -> List[Example]:
    """The teacher utterances of ``split``, or those named by ``ids`` (everything but the
    encoder outputs, read per batch). Damaged files are skipped with a warning."""
    if ids is None:
        ids = teacher_ids(data_dir, split)
    examples = []
    for utterance_id in ids[:limit]:
        path = os.path.join(data_dir, "teacher", f"{utterance_id}.npz")
        try:
            with np.load(path) as data:
                fields = {k: data[k] for k in ("states", "tokens", "prompt")}
                if "top_ids" in data.files:
                    fields.update(
                        top_ids=data["top_ids"],
                        top_log_probs=data["top_log_probs"],
                        audio_frames=int(data["audio_frames"]),
                    )
                if "attended_frames" in data.files:
                    fields["attended_frames"] = data["attended_frames"]
        except DAMAGED as error:  # a damaged file costs one utterance
            logging.getLogger(__name__).warning("skipped teacher file %s: %s", path, error)
            continue
        examples.append(Example(path=path, **fields))
    return examples


@dataclass(frozen=True)
class SpeechWindow:
    """The first 30 s window of one real recording, as ``validate`` reads it (no labels: the
    loop itself decides what is accepted).

    Attributes:
        name: the recording's file name.
        encoder_output: [frames, d] float16, the float32 target's encoder output.
        prompt: the prompt (timestamps on or off by a stable hash of the name, as in extraction).
        audio_frames: encoder frames holding audio.
    """

    name: str
    encoder_output: np.ndarray
    prompt: np.ndarray
    audio_frames: int


def speech_windows(target, manifests: Sequence[str], limit: Optional[int] = None) -> List[SpeechWindow]:
    """Encode the first window of the recordings in the ``manifests`` (``audio<TAB>text`` TSV
    files, as ``ct2-flash bench`` reads) once, for validation on real speech.

    Args:
        target: the float32 ``FlashWhisperModel`` the run validates with.
        limit: at most this many, spread evenly over the manifests' recordings in order
            (a validation in the loop costs about a second per window on 2 cores).
    """
    from ctranslate2 import StorageView
    from faster_whisper.audio import decode_audio

    from ct2_flash.adapter.audio import audio_frames
    from ct2_flash.benchmark.manifest import read_manifest
    from ct2_flash.train.extract import prompt_for

    special = target.decoder.runtime.special
    utterances = [utterance for manifest in manifests for utterance in read_manifest(manifest)]
    if limit is not None and len(utterances) > limit:
        utterances = [utterances[i] for i in np.linspace(0, len(utterances) - 1, limit).round().astype(int)]
    windows = []
    for utterance in utterances:
        features = target.window_features(
            decode_audio(utterance.path, sampling_rate=target.feature_extractor.sampling_rate)
        )
        batch = np.ascontiguousarray(features[None], dtype=np.float32)
        encoded = target.reference_model.encode(StorageView.from_array(batch), to_cpu=True)
        windows.append(
            SpeechWindow(
                name=utterance.name,
                encoder_output=np.asarray(encoded)[0].astype(np.float16),
                prompt=np.asarray(prompt_for(utterance.name, special), dtype=np.int64),
                audio_frames=audio_frames(batch)[0],
            )
        )
    return windows


def order_by_length(examples: Sequence[Example]) -> List[int]:
    """Indices of ``examples`` sorted by audio frames (``sample_batch`` draws neighbours)."""
    return sorted(range(len(examples)), key=lambda i: (examples[i].audio_frames or 0, i))


def _readable(example: Example) -> bool:
    try:
        _ = example.encoder_output  # reading it is the check
    except DAMAGED:
        return False
    return True


def drafter_frames(example: Example, total: int) -> int:
    """Encoder frames the runtime drafter reads for this utterance (``DraftWindow.drafter_audio``)."""
    return total if example.audio_frames is None else min(total, example.audio_frames + PADDING_FRAMES_SEEN)


def batch_frames(examples: Sequence[Example], total: int) -> int:
    """Encoder frames a batch reads: the longest audio plus the padding the runtime drafter sees."""
    return max(drafter_frames(e, total) for e in examples)


# AnchorDraft: attention within this many frames (20 ms each) of the target's counts as on it.
ANCHOR_RADIUS = 2


def make_batch(
    examples: Sequence[Example],
    k: int,
    blocks: int,
    rng: np.random.Generator,
    audio_window: Optional[Tuple[int, int]] = None,
) -> Dict[str, torch.Tensor]:
    """Pack up to ``blocks`` anchor blocks per utterance.

    Returns tensors: encoder [B, F, d] (F = ``batch_frames``), history [B, T, d],
    history_positions [B, T], history_length [B], anchors [B, N], anchor_index [B, N]
    (history entries visible to the block = anchor index + 1), anchor_positions [B, N],
    labels [B, N, K], and when every example has them soft_ids / soft_log_probs
    [B, N, K, top] (the target's distribution at each label; log-prob -inf where none).
    When every example has its attended frames: label_frames [B, N, K] (the frame the target
    reads for each label, -1 where none), and cross_mask [B, N * (K + 1), F] (the frames each
    block reads: the runtime's window around the anchor's frame with ``audio_window``, else
    the utterance's drafter frames).
    """
    batch, d = len(examples), examples[0].states.shape[1]
    longest = max(len(e.tokens) for e in examples)
    soft = all(e.top_ids is not None for e in examples)
    top = examples[0].top_ids.shape[1] if soft else 0
    positioned = all(e.attended_frames is not None for e in examples)
    frames = batch_frames(examples, TOTAL_FRAMES)
    arrays = {
        "history": np.zeros((batch, longest, d), np.float32),
        "history_positions": np.zeros((batch, longest), np.int64),
        "history_length": np.zeros(batch, np.int64),
        "anchors": np.zeros((batch, blocks), np.int64),
        "visible": np.zeros((batch, blocks), np.int64),
        "anchor_positions": np.zeros((batch, blocks), np.int64),
        "labels": np.full((batch, blocks, k), IGNORE, np.int64),
        "soft_ids": np.zeros((batch, blocks, k, top), np.int64),
        "soft_log_probs": np.full((batch, blocks, k, top), -np.inf, np.float32),
        "label_frames": np.full((batch, blocks, k), -1, np.int64),
        "cross_mask": np.zeros((batch, blocks, frames), bool),
    }
    for b, example in enumerate(examples):
        _pack_example(arrays, b, example, rng, k, soft, positioned, audio_window)
    encoder = np.zeros((batch, frames, d), np.float32)
    for b, example in enumerate(examples):  # training utterances store only their own frames
        own = example.encoder_output[:frames]
        encoder[b, : len(own)] = own
    names = ("history", "history_positions", "history_length", "anchors", "visible", "anchor_positions", "labels")
    tensors = {"encoder": torch.from_numpy(encoder), **{name: torch.from_numpy(arrays[name]) for name in names}}
    if soft:
        tensors.update(
            soft_ids=torch.from_numpy(arrays["soft_ids"]), soft_log_probs=torch.from_numpy(arrays["soft_log_probs"])
        )
    if positioned:
        tensors.update(
            label_frames=torch.from_numpy(arrays["label_frames"]),
            cross_mask=torch.from_numpy(np.repeat(arrays["cross_mask"], k + 1, axis=1)),  # every token of a block
        )
    return tensors


def _pack_example(
    arrays: Dict[str, np.ndarray],
    b: int,
    example: Example,
    rng: np.random.Generator,
    k: int,
    soft: bool,
    positioned: bool,
    audio_window: Optional[Tuple[int, int]],
) -> None:
    """Row ``b`` of ``make_batch``'s arrays: the example's history, and up to ``blocks``
    anchors drawn at random, each with its labels (and soft labels, label frames and the frames
    its block reads where the batch has them); padding blocks see nothing and learn nothing."""
    blocks = arrays["anchors"].shape[1]
    n, offset = len(example.tokens), len(example.prompt) - 1
    arrays["history"][b, :n] = example.states
    arrays["history_positions"][b, :n] = offset + np.arange(n)
    arrays["history_length"][b] = n
    choices = rng.choice(n - 1, size=min(blocks, n - 1), replace=False)  # anchors with a label
    for slot, a in enumerate(sorted(choices)):
        arrays["anchors"][b, slot] = example.tokens[a]
        arrays["visible"][b, slot] = a + 1  # states 0..a: positions strictly before the anchor's
        arrays["anchor_positions"][b, slot] = offset + 1 + a
        follow = example.tokens[a + 1 : a + 1 + k]
        arrays["labels"][b, slot, : len(follow)] = follow
        if soft:  # row i of the teacher's distribution predicts tokens[i]
            arrays["soft_ids"][b, slot, : len(follow)] = example.top_ids[a + 1 : a + 1 + k]
            arrays["soft_log_probs"][b, slot, : len(follow)] = example.top_log_probs[a + 1 : a + 1 + k]
        if positioned:
            arrays["label_frames"][b, slot, : len(follow)] = example.attended_frames[a + 1 : a + 1 + k]
            own = drafter_frames(example, TOTAL_FRAMES)
            # The runtime places the window after a verification; the first anchor has none.
            start, stop = (
                (0, own)
                if audio_window is None or a == 0
                else audio_window_span(int(example.attended_frames[a]), own, audio_window)
            )
            arrays["cross_mask"][b, slot, start:stop] = True
    for slot in range(len(choices), blocks):  # padding blocks: see nothing, learn nothing
        arrays["anchor_positions"][b, slot] = offset + 1
        arrays["cross_mask"][b, slot] = True


TOTAL_FRAMES = 1500  # encoder frames of a 30 s window


def sample_batch(by_length: Sequence[int], batch_size: int, rng: np.random.Generator) -> List[int]:
    """One batch of utterances of similar length (a batch reads its longest one's frames).

    An utterance drawn uniformly picks the neighbourhood: the batch comes from the 4 x
    ``batch_size`` utterances around it in ``by_length`` (indices sorted by audio frames),
    clamped at the ends, so every utterance stays about as likely as before.
    """
    window = min(len(by_length), 4 * batch_size)
    centre = int(rng.integers(len(by_length)))
    start = min(max(0, centre - window // 2), len(by_length) - window)
    return [by_length[start + int(i)] for i in rng.choice(window, batch_size, replace=window < batch_size)]


def position_weights(k: int) -> torch.Tensor:
    """exp(-(j-1)/4) for j = 1..K: early positions matter most, every later one needs them."""
    return torch.exp(-torch.arange(k, dtype=torch.float32) / 4.0)


def loss_of(
    model: FlashDrafterModel,
    batch: Dict[str, torch.Tensor],
    full_to_short: torch.Tensor,
    kl_weight: float = 0.0,
    anchor_weight: float = 0.0,
) -> torch.Tensor:
    """Weighted cross-entropy over the K draft positions of every packed block, plus
    ``kl_weight`` times the distillation loss on the target's distribution and
    ``anchor_weight`` times the AnchorDraft loss (where the last layer reads the audio).

    The distillation term is the cross-entropy against the target's top-k distribution
    renormalised over the tokens the shortlist holds (KL up to the target's entropy, which has
    no gradient). The batch's ``cross_mask``, when present, limits what each block reads."""
    k = model.config.num_draft_tokens
    x, positions = model.embed_blocks(batch["anchors"], batch["anchor_positions"])
    history_kvs = model.history_kv(model.project_history(batch["history"]), batch["history_positions"])
    # The model decides how much history it attends to (none in the no-history ablation).
    history_size = history_kvs[0][0].shape[1]
    mask = block_attention_mask(batch["visible"], batch["history_length"], history_size, k, model.config.causal_blocks)
    anchored = anchor_weight > 0 and model.config.use_audio
    if anchored and "label_frames" not in batch:
        raise ValueError(
            "anchor_weight > 0 needs the frames the target attends to: rerun the extract step, or pass anchor_weight=0"
        )
    out = model.forward_blocks(
        x,
        positions,
        history_kvs,
        model.cross_kv(batch["encoder"]),
        mask,
        batch.get("cross_mask"),
        cross_weights=anchored,
    )
    states, attention = out if anchored else (out, None)
    states = states.unflatten(1, (-1, k + 1))[:, :, 1:]  # mask positions: [B, N, K, d]
    # One log-softmax over the shortlist serves both terms (computing it twice was a visible share of a step).
    log_probs = torch.log_softmax(model.logits(states), dim=-1)  # [B, N, K, shortlist]
    labels = batch["labels"]
    targets = torch.where(labels >= 0, full_to_short[labels.clamp(min=0)], IGNORE)
    losses = F.nll_loss(log_probs.flatten(0, 2), targets.flatten(), ignore_index=IGNORE, reduction="none")
    if kl_weight > 0:
        if "soft_ids" not in batch:
            raise ValueError(
                "kl_weight > 0 needs the target's top-k distributions: rerun the extract step "
                "(teacher data from before they were stored lacks them), or pass kl_weight=0"
            )
        short_ids = full_to_short[batch["soft_ids"]]  # [B, N, K, top], IGNORE outside the shortlist
        teacher = batch["soft_log_probs"].masked_fill(short_ids < 0, float("-inf"))
        teacher = torch.softmax(teacher, dim=-1).nan_to_num(0.0)  # rows with nothing in the shortlist: 0
        student = log_probs.gather(-1, short_ids.clamp(min=0))
        losses = losses + kl_weight * -(teacher * student).sum(-1).flatten()
    weights = position_weights(k).expand_as(labels).flatten() * (targets.flatten() != IGNORE)
    loss = (losses * weights).sum() / weights.sum().clamp(min=1.0)
    if anchored:
        loss = loss + anchor_weight * anchor_loss(attention.unflatten(1, (-1, k + 1))[:, :, 1:], batch["label_frames"])
    return loss


def anchor_loss(attention: torch.Tensor, label_frames: torch.Tensor) -> torch.Tensor:
    """AnchorDraft: mean over labelled mask positions of -log(attention mass within
    ``ANCHOR_RADIUS`` frames of the frame the target reads for that token).

    Args:
        attention: [B, N, K, F] head-averaged cross-attention of the mask positions.
        label_frames: [B, N, K] the target's frame per label, -1 where there is none.
    """
    frames = attention.shape[-1]
    offsets = torch.arange(-ANCHOR_RADIUS, ANCHOR_RADIUS + 1)
    index = label_frames[..., None] + offsets  # [B, N, K, 2r + 1]
    inside = (index >= 0) & (index < frames) & (label_frames[..., None] >= 0)
    mass = (attention.gather(-1, index.clamp(0, frames - 1)) * inside).sum(-1)  # [B, N, K]
    labelled = label_frames >= 0
    return -(mass[labelled].float().clamp(min=1e-6).log()).sum() / labelled.sum().clamp(min=1)


def learning_rate(config: FitConfig, step: int) -> float:
    if step < config.warmup_steps:
        return config.learning_rate * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return config.learning_rate * (config.min_lr_ratio + (1 - config.min_lr_ratio) * cosine)


def text_token_counts(data_dir: str, tokenizer, vocab_size: int) -> np.ndarray:
    """[vocab] how often each token occurs in the texts of every synthesized training
    utterance, extracted or not yet (``tokenizer``: the target's, a ``tokenizers.Tokenizer``)."""
    counts = np.zeros(vocab_size, np.int64)
    with open(os.path.join(data_dir, "manifest.jsonl"), encoding="utf-8") as stream:
        texts = [" " + e["text"].strip() for e in map(json.loads, stream) if e["split"] == "train"]
    for encoding in tokenizer.encode_batch(texts, add_special_tokens=False):
        counts += np.bincount(np.asarray(encoding.ids, dtype=np.int64), minlength=vocab_size)[:vocab_size]
    return counts


def shortlist_from(
    examples: Sequence[Example], size: int, special, text_counts: Optional[np.ndarray] = None
) -> np.ndarray:
    """The draft-head vocabulary: all special and timestamp tokens plus the most frequent
    tokens the target itself emitted in training, and in the texts of the training speech
    (``text_counts``: a run that takes in data extracted later must already have its tokens)
    (sorted ids)."""
    counts = np.bincount(np.concatenate([e.tokens for e in examples]), minlength=special.vocab_size)
    if text_counts is not None:
        counts = counts + text_counts
    always = np.arange(special.eot, special.vocab_size)
    text_budget = max(0, size - len(always))
    frequent = np.argsort(-counts[: special.eot], kind="stable")[:text_budget]
    return np.sort(np.concatenate([frequent, always]))


def validate(
    model: FlashDrafterModel,
    decoder,
    examples: Sequence[Union[Example, SpeechWindow]],
    audio_window: Optional[Tuple[int, int]] = None,
) -> Dict[str, float]:
    """Mean accepted length per round in the real cached loop on validation windows (the
    drafter reading ``audio_window`` around the target's position, as at run time): held-out
    teacher utterances or real recordings (``speech_windows``)."""
    from ctranslate2 import StorageView

    from ct2_flash.loop.options import DecodingOptions

    model.eval()
    stats = decoder.stats
    stats.reset()
    # Every round drafts all K (no draft pause, no confidence cut): the network is what is judged.
    with decoder.use_drafter(FlashDrafter(model, min_confidence=0.0, audio_window=audio_window)):
        for example in examples:
            encoder_output = StorageView.from_array(
                np.ascontiguousarray(example.encoder_output[None], dtype=np.float32)
            )
            decoder.decode(
                encoder_output, [int(t) for t in example.prompt], DecodingOptions(), audio_frames=example.audio_frames
            )
    rounds = max(1, stats.draft_rounds)
    return {
        "mean_accepted_length": stats.accepted / rounds,
        "acceptance_rate": stats.acceptance_rate,
        "tokens_per_call": stats.tokens_per_call,
        "first_position_acceptance": stats.accepted_by_position[0] / max(1, stats.proposed_by_position[0]),
        "drafter_ms_per_round": 1000 * stats.drafter_seconds / rounds,
        "verify_ms_per_call": 1000 * stats.verify_seconds / max(1, stats.target_calls),
    }


def train_step(
    model: FlashDrafterModel,
    optimizer,
    batch: Dict[str, torch.Tensor],
    full_to_short: torch.Tensor,
    config: FitConfig,
    step: int,
) -> float:
    """One update at ``step`` of the schedule; returns the loss. With ``config.bf16`` the
    forward pass runs under bfloat16 autocast (the weights and the optimizer stay float32)."""
    for group in optimizer.param_groups:
        group["lr"] = learning_rate(config, step)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=config.bf16):
        loss = loss_of(model, batch, full_to_short, config.kl_weight, config.anchor_weight)
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(_trainable(model).values(), config.clip_norm)
    optimizer.step()
    return loss.item()


def _trainable(model: FlashDrafterModel) -> Dict[str, torch.nn.Parameter]:
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def freeze_for(model: FlashDrafterModel, trained: str) -> None:
    """Leave only what ``trained`` (``TRAINED``) names trainable."""
    if trained == "all":
        return
    last = f"layers.{model.config.num_layers - 1}."
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(name.startswith(last) or name.startswith("final_norm."))


def _save_state(path: str, model, optimizer, meta: dict) -> None:
    tensors = {f"model.{n}": t.detach().contiguous() for n, t in model.state_dict().items()}
    names = {id(p): n for n, p in _trainable(model).items()}
    for parameter, state in optimizer.state.items():
        for key in ("exp_avg", "exp_avg_sq"):
            tensors[f"adam.{names[id(parameter)]}.{key}"] = state[key].contiguous()
        meta.setdefault("adam_steps", {})[names[id(parameter)]] = float(state["step"])
    save_file(tensors, path + ".safetensors.tmp")
    with open(path + ".json.tmp", "w", encoding="utf-8") as stream:
        json.dump(meta, stream, indent=2)
    os.replace(path + ".safetensors.tmp", path + ".safetensors")  # both or neither: json last
    os.replace(path + ".json.tmp", path + ".json")


def _model_tensors(tensors: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """The model's part of a saved training state (``_save_state`` prefixes it ``model.``)."""
    return {name[len("model.") :]: tensor for name, tensor in tensors.items() if name.startswith("model.")}


def _load_state(path: str, model, optimizer) -> dict:
    with open(path + ".json", encoding="utf-8") as stream:
        meta = json.load(stream)
    tensors = load_file(path + ".safetensors")
    model.load_state_dict(_model_tensors(tensors))
    for name, parameter in _trainable(model).items():
        if f"adam.{name}.exp_avg" in tensors:
            optimizer.state[parameter] = {
                "step": torch.tensor(meta["adam_steps"][name]),
                "exp_avg": tensors[f"adam.{name}.exp_avg"],
                "exp_avg_sq": tensors[f"adam.{name}.exp_avg_sq"],
            }
    return meta


def _validate(model: FlashDrafterModel, target, valid, real, config: FitConfig, meta: dict, out_dir: str) -> None:
    """Score the model on the validation windows (and real speech), record it in ``meta``,
    and save it as ``out_dir/best`` when it is the best so far."""
    scores = validate(model, target.decoder, valid, config.audio_window)
    scores["step"] = meta["step"]
    if real:
        scores["real"] = {**validate(model, target.decoder, real, config.audio_window), "windows": len(real)}
    meta["validations"].append(scores)
    score = (scores["real"] if real else scores)["mean_accepted_length"]
    if score > meta["best"]:
        meta["best"] = score
        save_checkpoint(model, os.path.join(out_dir, "best"))


def snapshot(run_dir: str, out_dir: str, model_name: str = "tiny.en") -> str:
    """The run's latest saved weights (``train_state``, every ``save_every`` steps) as a drafter
    checkpoint in ``out_dir``, for measurements between validations. The architecture is the
    best checkpoint's, with causal blocks when the run trains them now.

    Raises:
        FileNotFoundError: the run has no saved state or no best checkpoint yet.
    """
    from ct2_flash.engine.models import resolve_model

    state_path = os.path.join(run_dir, "train_state")
    if not os.path.isfile(state_path + ".json") or not os.path.isdir(os.path.join(run_dir, "best")):
        raise FileNotFoundError(f"{run_dir} has no saved training state or no best checkpoint yet (fit writes both)")
    with open(state_path + ".json", encoding="utf-8") as stream:
        meta = json.load(stream)
    best = load_checkpoint(os.path.join(run_dir, "best"), resolve_model(model_name))
    model = FlashDrafterModel(replace(best.config, causal_blocks="causal_blocks_from_step" in meta))
    model.load_state_dict(_model_tensors(load_file(state_path + ".safetensors")))
    save_checkpoint(model, out_dir)
    return out_dir


def fit(
    data_dir: str,
    out_dir: str,
    config: FitConfig,
    model_name: str = "tiny.en",
    shortlist_size: int = 8192,
    threads: int = 2,
    progress: bool = True,
    use_audio: bool = True,
    use_history: bool = True,
    init_from: Optional[str] = None,
    grow: bool = False,
    real_speech: Sequence[str] = (),
    compute_type: str = "float32",
    deadline: Optional[float] = None,
) -> dict:
    """Train (or resume) a drafter; the best checkpoint by validation accepted length goes to
    ``out_dir/best``. ``use_audio`` / ``use_history`` False train the paper's ablations.

    ``init_from``: a drafter checkpoint directory to start from instead of the target's blocks
    (a new schedule on more data); its architecture and shortlist are kept, so
    ``shortlist_size``, ``use_audio`` and ``use_history`` must not contradict it.

    ``grow``: when the run resumes, training utterances extracted since it started join it
    from that step on (recorded in ``data_growth``), so one long schedule can run across
    sessions while synthesis and extraction go on; the validation utterances never change.
    Without it a resumed run trains on exactly the utterances it started with.

    ``real_speech``: manifests of real recordings (``audio<TAB>text``); each validation also
    runs on their first windows (``real`` in the record), and the best checkpoint is then
    chosen by real speech, which the drafter must serve, rather than by held-out synthetic
    voices. A resumed run that starts validating on real speech starts its choice afresh.

    A run from ``init_from`` validates that checkpoint before its first step, so the best
    checkpoint is never worse on the validation windows than where it started.

    ``compute_type``: the target the validations decode with (the teacher data's own).
    ``deadline``: a ``time.time()`` after which the run saves and stops before its last step
    (``stopped_at`` in the record); the schedule stays the one ``config`` sets.
    """
    from ct2_flash.adapter.whisper_model import FlashWhisperModel
    from ct2_flash.engine.models import resolve_model

    torch.set_num_threads(threads)
    model_path = resolve_model(model_name)
    state_path = os.path.join(out_dir, "train_state")
    resumed = os.path.exists(state_path + ".json")
    data = _utterance_ids(data_dir, state_path if resumed else None, grow)
    train = load_examples(data_dir, "train", ids=data["train_ids"])
    valid = load_examples(data_dir, "validation", config.validation_windows, ids=data["validation_ids"])
    if not train or not valid:
        raise RuntimeError(f"no teacher data in {data_dir}: run the synth and extract steps first")
    target = FlashWhisperModel(
        model_path, stock_engine=False, compute_type=compute_type, cpu_threads=threads, redecodes=False, near_exact=True
    )
    real = speech_windows(target, real_speech, config.validation_windows)
    if init_from is not None:
        model = _checkpoint_to_train(init_from, model_path, use_audio, use_history)
    else:
        model = _new_drafter(model_path, model_name, data_dir, train, target, shortlist_size, use_audio, use_history)
    freeze_for(model, config.trained)
    model.train()
    optimizer = torch.optim.AdamW(_trainable(model).values(), lr=config.learning_rate, weight_decay=config.weight_decay)
    os.makedirs(out_dir, exist_ok=True)
    meta = _run_record(
        state_path if resumed else None,
        model,
        optimizer,
        dict(fit_config=asdict(config), init_from=init_from, best_by="real" if real else "validation", **data),
        len(train),
        len(valid),
    )
    meta.update(real_speech=[window.name for window in real], compute_type=target.decoder.runtime.model.compute_type)
    # Runs started before causal blocks existed switch to them when they resume (a fine-tune
    # from that step on); the step is recorded.
    if model.config.causal_blocks:
        meta.setdefault("causal_blocks_from_step", meta["step"])
    meta["skipped_files"] = sorted(set(meta.get("skipped_files", [])) | set(_unreadable(data, train + valid, config)))
    training = _Training(model, optimizer, target, valid, real, config, meta, out_dir, state_path)
    if init_from is not None and meta["step"] == 0 and not meta["validations"]:
        _validate(model, target, valid, real, config, meta, out_dir)
    training.run(train, data_dir, deadline, progress)
    return meta


def _unreadable(data: dict, loaded_examples: list, config: FitConfig) -> List[str]:
    """The teacher files of the run's utterances that did not load."""
    loaded = {os.path.basename(e.path) for e in loaded_examples}
    wanted = data["train_ids"] + data["validation_ids"][: config.validation_windows]
    return [f"{i}.npz" for i in wanted if f"{i}.npz" not in loaded]


def _utterance_ids(data_dir: str, state_path: Optional[str], grow: bool) -> dict:
    """{"train_ids", "validation_ids"}: the teacher data's, or for a resumed run (its
    ``state_path``) the utterances it started with, so that it draws the same batches (with
    ``grow``, and the training utterances extracted since)."""
    data = {"train_ids": teacher_ids(data_dir, "train"), "validation_ids": teacher_ids(data_dir, "validation")}
    if state_path is None:
        return data
    with open(state_path + ".json", encoding="utf-8") as stream:
        saved = json.load(stream)
    current = data["train_ids"]
    data = {key: list(dict.fromkeys(saved.get(key, value))) for key, value in data.items()}
    if grow:
        known = set(data["train_ids"])
        data["train_ids"] = data["train_ids"] + [i for i in current if i not in known]
    return data


def _checkpoint_to_train(init_from: str, model_path: str, use_audio: bool, use_history: bool):
    """A drafter checkpoint to go on training; ValueError if it was trained otherwise."""
    model = load_checkpoint(init_from, model_path)
    wanted = {"use_audio": use_audio, "use_history": use_history}
    clashes = [f"{name}={value}" for name, value in wanted.items() if getattr(model.config, name) != value]
    if clashes:
        raise ValueError(f"{init_from} was not trained with {', '.join(clashes)}")
    return model


def _new_drafter(
    model_path: str,
    model_name: str,
    data_dir: str,
    train: list,
    target,
    shortlist_size: int,
    use_audio: bool,
    use_history: bool,
):
    """A new drafter on the target's own blocks, with a shortlist of the tokens the training
    data uses most."""
    special = target.decoder.runtime.special
    text_counts = text_token_counts(data_dir, target.hf_tokenizer, special.vocab_size)
    shortlist = shortlist_from(train, shortlist_size, special, text_counts)
    # Causal blocks: a round that verifies few drafts computes only their rows.
    drafter_config = DrafterConfig(
        target=target_identity(model_path, model_name),
        shortlist_size=len(shortlist),
        use_audio=use_audio,
        use_history=use_history,
        causal_blocks=True,
    )
    model = FlashDrafterModel(drafter_config)
    model.init_from_target(CT2ModelFile(model_path))
    model.shortlist.copy_(torch.from_numpy(shortlist))
    return model


def _run_record(
    state_path: Optional[str], model, optimizer, fields: dict, train_utterances: int, validation_utterances: int
) -> dict:
    """The run's record (``train_state.json``): a new one with ``fields`` (the config, the
    utterance ids, where it started, what chooses the best), or for a resumed run the saved one,
    the model and optimizer loaded from it, brought up to date."""
    if state_path is None:
        return {
            "step": 0,
            "best": -1.0,
            "validations": [],
            "train_utterances": train_utterances,
            "validation_utterances": validation_utterances,
            "seconds": 0.0,
            "losses": [],
            **fields,
        }
    meta = _load_state(state_path, model, optimizer)
    if len(fields["train_ids"]) > len(meta.get("train_ids", fields["train_ids"])):
        meta.setdefault("data_growth", []).append({"step": meta["step"], "train_utterances": train_utterances})
    # Runs saved before the ids were recorded keep what they resume with.
    meta.update(train_ids=fields["train_ids"], validation_ids=fields["validation_ids"])
    meta["train_utterances"] = train_utterances
    if meta.get("best_by", "validation") != fields["best_by"]:  # scores of another set do not compare
        meta.update(best=-1.0, best_by=fields["best_by"])
    return meta


class _Training:
    """The steps of one ``fit`` run, from ``meta["step"]`` to the schedule's end."""

    def __init__(
        self, model, optimizer, target, valid, real, config: FitConfig, meta: dict, out_dir: str, state_path: str
    ) -> None:
        self.model, self.optimizer, self.target = model, optimizer, target
        self.valid, self.real, self.config, self.meta, self.out_dir = valid, real, config, meta, out_dir
        self.state_path = state_path
        # After the resume: the shortlist is the saved one. The data may have grown since, and a
        # shortlist recounted from it maps tokens to other head rows (a resumed loss of ~10
        # instead of ~3 was the sign).
        special = target.decoder.runtime.special
        self.full_to_short = torch.full((special.vocab_size,), IGNORE, dtype=torch.long)
        self.full_to_short[model.shortlist] = torch.arange(len(model.shortlist))
        self.started = time.time() - meta["seconds"]

    def run(self, train: list, data_dir: str, deadline: Optional[float], progress: bool) -> None:
        """Batches, validations and saves as the config says, until the last step or the
        ``deadline`` (then saved, ``stopped_at``). A teacher file that no longer reads is
        dropped and the batch drawn again."""
        from tqdm import tqdm

        config, meta = self.config, self.meta
        by_length = order_by_length(train)
        bar = tqdm(total=config.steps, initial=meta["step"], desc="fit", disable=not progress)
        while meta["step"] < config.steps:
            step = meta["step"]
            if deadline is not None and time.time() > deadline:
                logging.getLogger(__name__).warning(
                    "fit: out of time at step %d of %d; the best checkpoint so far stays", step, config.steps
                )
                meta["stopped_at"] = step
                self.save()
                break
            self.model.train()
            rng = np.random.default_rng([config.seed, step])
            chosen = [train[i] for i in sample_batch(by_length, config.batch_size, rng)]
            try:
                batch = make_batch(
                    chosen, self.model.config.num_draft_tokens, config.blocks_per_utterance, rng, config.audio_window
                )
            except DAMAGED as error:  # an encoder output that no longer reads: drop it, draw again
                damaged = next(e for e in chosen if not _readable(e))
                logging.getLogger(__name__).warning("dropped teacher file %s at step %d: %s", damaged.path, step, error)
                meta["skipped_files"].append(os.path.basename(damaged.path))
                train = [e for e in train if e.path != damaged.path]
                if not train:
                    raise RuntimeError(f"every training file in {data_dir} is damaged") from error
                by_length = order_by_length(train)
                continue
            loss = train_step(self.model, self.optimizer, batch, self.full_to_short, config, step)
            meta["step"] = step + 1
            meta["losses"].append(round(loss, 4))
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}")
            if meta["step"] % config.validate_every == 0 or meta["step"] == config.steps:
                _validate(self.model, self.target, self.valid, self.real, config, meta, self.out_dir)
            if meta["step"] % config.save_every == 0 or meta["step"] == config.steps:
                self.save()
        bar.close()

    def save(self) -> None:
        self.meta["seconds"] = time.time() - self.started
        _save_state(self.state_path, self.model, self.optimizer, self.meta)
