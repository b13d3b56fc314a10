"""The draft round as three exportable PyTorch modules (one ONNX graph each).

A draft round has three parts with different lifetimes, so each is its own graph:

- ``AudioKeys``: once per window, the drafter's cross-attention keys/values of the encoder
  output, for every layer.
- ``HistoryKeys``: once per round, the self-attention keys/values of the target states the
  round kept (they only grow, and are cut back on rollback by the runtime).
- ``ProposeBlock``: once per round, up to K draft tokens after an anchor, reading the two
  caches. It computes as many mask rows as its ``positions`` input has beyond the anchor:
  with ``causal_blocks`` a round that will verify few drafts computes only their rows and
  proposes what the K-row block would; without, the runtime always passes K (the rows read
  each other, and a shorter block proposed other tokens: about a quarter of the first
  positions differed at 2 rows on real speech).

Every cache is one tensor per layer and per keys/values, in the layout the attention reads
without a copy (a sliced or split input costs a full copy in ONNX Runtime: 1.6 ms per round for
the audio keys when they were one stacked tensor). History keys/values are ``[T, heads,
head_dim]``, so the first T rows of a preallocated buffer are one contiguous block: a rollback
is a shorter T and no round copies the cache. Audio keys/values are ``[heads, frames,
head_dim]``, head-major.

The anchor enters as its embedding row (the runtime looks it up in the target's embedding,
which it holds anyway): the 51,864-row table would otherwise be a constant of the graph.
"""

from __future__ import annotations

import torch
from torch import nn

from ct2_flash.drafting.flash_model import FlashDrafterModel


def _check_exportable(model: FlashDrafterModel) -> None:
    if not (model.config.use_audio and model.config.use_history):
        raise ValueError(
            "ablation drafters (no audio or no history) are for experiments and run in PyTorch only; "
            "only a full drafter can be converted"
        )


def cache_names(prefix: str, num_layers: int) -> list:
    """Input/output names of a per-layer cache: keys_0, values_0, keys_1, ... with ``prefix``."""
    return [f"{prefix}_{kind}_{layer}" for layer in range(num_layers) for kind in ("keys", "values")]


class AudioKeys(nn.Module):
    """[1, frames, d] encoder output -> per layer, keys and values [heads, frames, head_dim]."""

    def __init__(self, model: FlashDrafterModel) -> None:
        super().__init__()
        _check_exportable(model)
        self.model = model

    def forward(self, encoder_output: torch.Tensor) -> torch.Tensor:
        return tuple(t[0] for kv in self.model.cross_kv(encoder_output) for t in kv)


class HistoryKeys(nn.Module):
    """Target states [T, history_dim] at text positions [T] -> per layer, keys and values
    [T, heads, head_dim]."""

    def __init__(self, model: FlashDrafterModel) -> None:
        super().__init__()
        _check_exportable(model)
        self.model = model

    def forward(self, states: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        projected = self.model.project_history(states[None])
        return tuple(t[0] for kv in self.model.history_kv(projected, positions[None]) for t in kv)


class ProposeBlock(nn.Module):
    """One block proposal.

    Inputs:
        anchor_embedding: [1, d] the anchor's token embedding.
        positions: [k + 1] int64, the text positions t .. t + k of the anchor (t = the target's
            cache length) and of the k <= K mask rows to compute.
        history keys, values per layer: [T, heads, head_dim] (T may be 0).
        audio keys, values per layer: [heads, frames, head_dim].
    Outputs:
        tokens: [k] int64 the most likely token at each mask position.
        log_probs: [k] float32 its log-probability under the drafter (over the shortlist).
        logits: [k, shortlist] float32 every shortlist token's logit (column i is token
            ``vocabulary[i]``, recorded in ``export.json``): the proposal distribution that
            sampled decoding draws drafts from.
    """

    def __init__(self, model: FlashDrafterModel) -> None:
        super().__init__()
        _check_exportable(model)
        self.model = model
        self.register_buffer("vocabulary", model.shortlist.clone())
        self.register_buffer("head", model.token_embedding[model.shortlist].T.contiguous())  # [d, shortlist]

    def forward(self, anchor_embedding, positions, *caches):
        model = self.model
        k = positions.shape[0] - 1  # traced as the input's length: a dynamic axis of the graph
        table = model.position_embedding[positions.clamp(max=model.config.max_positions - 1)]
        x = (torch.cat([anchor_embedding, model.mask_embedding[:k]]) + table)[None]  # [1, k + 1, d]
        layers = len(model.layers)
        history, audio = caches[: 2 * layers], caches[2 * layers :]
        history_kvs = [(history[2 * i][None], history[2 * i + 1][None]) for i in range(layers)]
        audio_kvs = [(audio[2 * i][None], audio[2 * i + 1][None]) for i in range(layers)]
        mask = model.proposal_mask(history[0].shape[0], k + 1)  # None without causal blocks
        states = model.forward_blocks(x, positions[None], history_kvs, audio_kvs, mask)
        logits = states[0, 1:] @ self.head  # [k, shortlist]
        log_probs = torch.log_softmax(logits, dim=-1)
        best, index = log_probs.max(dim=-1)
        return self.vocabulary[index], best, logits
