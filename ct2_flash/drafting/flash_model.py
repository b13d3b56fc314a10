"""The Whisper-Flash drafter network (PyTorch).

Paper symbols, once: for an anchor y_t the drafter reads ``x = [E(y_t) ; m_1 .. m_K]`` (the
anchor's token embedding and K learned mask vectors) at text positions t .. t+K and predicts
y_{t+1} .. y_{t+K} from the mask positions in one pass. Each of the layers (initialised from
the target's decoder blocks 0 and 1) does:

1. self-attention of the block over ``[H ; x]`` in one softmax, where H is the projected
   target history (final decoder states of positions < t); the block is bidirectional inside
   itself; RoPE on queries and keys with explicit positions, so cached history keys keep theirs;
2. cross-attention to the window's encoder output with the drafter's own key/value projections
   (computed once per window);
3. the feed-forward update.

The token embedding (input and tied output head) and the encoder are the target's and frozen.
Training packs up to 16 blocks per utterance into one pass with a mask that lets block n see
history positions < t_n and its own block only (``block_attention_mask``).
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ct2_flash.drafting.files import DrafterConfig, TargetIdentity  # noqa: F401 (re-exported)
from ct2_flash.engine.model_files import CT2ModelFile


def rope_table(size: int, head_dim: int, base: float) -> torch.Tensor:
    """[size, 2, head_dim // 2] cos and sin of RoPE phases for positions 0..size-1 (float32)."""
    half = head_dim // 2
    inv_freq = base ** (-torch.arange(half, dtype=torch.float64) / half)
    angles = torch.arange(size, dtype=torch.float64)[:, None] * inv_freq
    return torch.stack([angles.cos(), angles.sin()], dim=1).float()


def rotate(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """Apply RoPE.

    Args:
        x: [..., T, heads, head_dim]
        rope: [..., T, 2, head_dim // 2] cos and sin at each token's position (rows of
            ``rope_table``, looked up once per pass and shared by every layer).
    Returns:
        x rotated, same shape; phases are applied in float32 whatever x's dtype.
    """
    half = x.shape[-1] // 2
    cos, sin = rope[..., None, 0, :], rope[..., None, 1, :]  # [..., T, 1, half]
    first, second = x[..., :half].float(), x[..., half:].float()
    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1).to(x.dtype)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Attention, [B, heads, S, hd] x [B, heads, F, hd] -> [B, heads, S, hd] in q's dtype.

    ``mask``: [B, 1, S, F] boolean, True = may attend, or None. For the few unmasked queries
    of a draft round, plain matmuls beat the fused CPU kernel (2-3x at 9 queries); training's
    many queries keep the fused one. Keys and values may be stored in another dtype than q
    (bfloat16 encoder keys halve the memory a round reads); q is cast to theirs.
    """
    if mask is not None or q.shape[-2] > 32 or torch.is_grad_enabled():
        return F.scaled_dot_product_attention(q, k.to(q.dtype), v.to(q.dtype), attn_mask=mask)
    scores = (q.to(k.dtype) @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    return (torch.softmax(scores.float(), dim=-1).to(v.dtype) @ v).to(q.dtype)


class DrafterLayer(nn.Module):
    """One drafter block: self-attention over [history ; block], cross-attention, FFN."""

    def __init__(self, d_model: int, num_heads: int, ffn_dim: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.self_norm = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.self_out = nn.Linear(d_model, d_model)
        self.cross_norm = nn.LayerNorm(d_model)
        self.cross_q = nn.Linear(d_model, d_model)
        self.cross_kv = nn.Linear(d_model, 2 * d_model)
        self.cross_out = nn.Linear(d_model, d_model)
        self.ffn_norm = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, d_model)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.unflatten(-1, (self.num_heads, -1))  # [..., T, heads, head_dim]

    def history_kv(self, history: torch.Tensor, rope: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of projected history.

        Args:
            history: [B, T, d] projected history states.
            rope: [B, T, 2, head_dim // 2] RoPE phases at their text positions.
        Returns:
            keys, values: [B, T, heads, head_dim] (keys rotated).
        """
        _, k, v = self.qkv(self.self_norm(history)).chunk(3, dim=-1)
        return rotate(self._heads(k), rope), self._heads(v)

    def cross_kv_of(self, encoder_output: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """[B, F, d] encoder output -> keys, values [B, heads, F, head_dim] (once per window).

        Head-major and contiguous, so every round's attention reads them without a copy.
        """
        k, v = self.cross_kv(encoder_output).chunk(2, dim=-1)
        return self._heads(k).transpose(1, 2).contiguous(), self._heads(v).transpose(1, 2).contiguous()

    def forward(
        self,
        x: torch.Tensor,
        rope: torch.Tensor,
        history_kv: Tuple[torch.Tensor, torch.Tensor],
        cross_kv: Tuple[torch.Tensor, torch.Tensor],
        mask: Optional[torch.Tensor],
        cross_mask: Optional[torch.Tensor] = None,
        cross_weights: bool = False,
    ):
        """
        Args:
            x: [B, S, d] block tokens (one or several packed blocks).
            rope: [B, S, 2, head_dim // 2] RoPE phases at their text positions.
            history_kv: keys, values [B, T, heads, head_dim] of the history.
            cross_kv: keys, values [B, heads, F, head_dim] of the encoder output, or None
                to skip cross-attention (the no-audio ablation).
            mask: [B, S, T + S] boolean, True = may attend; None = everything visible.
            cross_mask: [B, S, F] boolean, the encoder frames each token may read (training's
                stand-in for the runtime's window of the audio), or None for all.
            cross_weights: also return the cross-attention weights (training's AnchorDraft
                loss supervises where the drafter reads).
        Returns:
            [B, S, d]; with ``cross_weights`` also [B, S, F], the head-averaged cross-attention.
        """
        qkv = self.qkv(self.self_norm(x)).unflatten(-1, (3 * self.num_heads, -1))  # [B, S, 3 * heads, head_dim]
        # Queries and keys share their positions: one rotation for both.
        q, k = rotate(qkv[:, :, : 2 * self.num_heads], rope).chunk(2, dim=2)
        k = torch.cat([history_kv[0], k], dim=1)
        v = torch.cat([history_kv[1], qkv[:, :, 2 * self.num_heads :]], dim=1)
        attended = _attend(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), None if mask is None else mask[:, None]
        )
        x = x + self.self_out(attended.transpose(1, 2).flatten(-2))
        weights = None
        if cross_kv is not None:
            q = self._heads(self.cross_q(self.cross_norm(x))).transpose(1, 2)  # [B, heads, S, head_dim]
            visible = None if cross_mask is None else cross_mask[:, None]
            if cross_weights:
                scores = (q @ cross_kv[0].to(q.dtype).transpose(-1, -2)) * q.shape[-1] ** -0.5
                if visible is not None:
                    scores = scores.masked_fill(~visible, float("-inf"))
                probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)  # [B, heads, S, F]
                attended = probs @ cross_kv[1].to(q.dtype)
                weights = probs.mean(1)
            else:
                attended = _attend(q, cross_kv[0], cross_kv[1], visible)
            x = x + self.cross_out(attended.transpose(1, 2).flatten(-2))
        x = x + self.fc2(F.gelu(self.fc1(self.ffn_norm(x))))
        return (x, weights) if cross_weights else x


class FlashDrafterModel(nn.Module):
    """The drafter network. Frozen: token embedding (input and tied head), position table."""

    def __init__(self, config: DrafterConfig) -> None:
        super().__init__()
        self.config = config
        d, vocab, k = config.d_model, config.target.vocab_size, config.num_draft_tokens
        self.register_buffer("token_embedding", torch.zeros(vocab, d), persistent=True)
        self.register_buffer("position_embedding", torch.zeros(config.max_positions, d), persistent=True)
        self.register_buffer(
            "shortlist",
            torch.arange(vocab) if not config.shortlist_size else torch.zeros(config.shortlist_size, dtype=torch.long),
        )
        self.mask_embedding = nn.Parameter(torch.zeros(k, d))
        self.history_proj = nn.Linear(config.history_dim, d)
        self.layers = nn.ModuleList(DrafterLayer(d, config.num_heads, config.ffn_dim) for _ in range(config.num_layers))
        self.final_norm = nn.LayerNorm(d)
        # A block may reach K positions past the context; positions beyond the table are
        # clamped to its last row (no such position is ever verified).
        table = rope_table(config.max_positions + k + 1, d // config.num_heads, config.rope_base)
        self.register_buffer("rope", table, persistent=False)

    def embed_blocks(self, anchors: torch.Tensor, anchor_positions: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Block inputs and positions.

        Args:
            anchors: [B, N] anchor tokens; anchor_positions: [B, N] their positions t.
        Returns:
            x: [B, N * (K + 1), d] (each block = anchor then K masks), positions [B, N * (K + 1)].
        """
        k = self.config.num_draft_tokens
        offsets = torch.arange(k + 1, device=anchors.device)
        positions = anchor_positions[..., None] + offsets  # [B, N, K+1]
        table = self.position_embedding[positions.clamp(max=self.config.max_positions - 1)]
        anchor = self.token_embedding[anchors][:, :, None]  # [B, N, 1, d]
        masks = self.mask_embedding.expand(*anchors.shape, k, -1)  # [B, N, K, d]
        x = torch.cat([anchor, masks], dim=2) + table
        return x.flatten(1, 2), positions.flatten(1, 2)

    def _rope_at(self, positions: torch.Tensor) -> torch.Tensor:
        """[...] positions -> [..., 2, head_dim // 2] float32 RoPE phases (kept float32 even
        when the model is cast to bfloat16)."""
        return self.rope[positions.clamp(max=self.rope.shape[0] - 1)].float()

    def project_history(self, states: torch.Tensor) -> torch.Tensor:
        """[B, T, history_dim] target states -> [B, T, d]."""
        return self.history_proj(states)

    def cross_kv(self, encoder_output: torch.Tensor):
        """Per-layer encoder keys/values for one window (reused every round); None per layer
        without audio."""
        if not self.config.use_audio:
            return [None] * len(self.layers)
        return [layer.cross_kv_of(encoder_output) for layer in self.layers]

    def history_kv(self, projected: torch.Tensor, positions: torch.Tensor):
        """Per-layer history keys/values.

        Caching them is exact because layer l's history keys depend only on the history
        itself: history tokens are inputs of every layer, never updated by the block.
        """
        if not self.config.use_history:  # the ablation: nothing of the target's states
            projected, positions = projected[:, :0], positions[:, :0]
        rope = self._rope_at(positions)
        return [layer.history_kv(projected, rope) for layer in self.layers]

    def proposal_mask(self, history_length, rows) -> Optional[torch.Tensor]:
        """Self-attention mask of one proposal block of ``rows`` rows (anchor and masks) after
        ``history_length`` history entries: [1, rows, history_length + rows] boolean, True = may
        attend; None (everything visible) unless the drafter has ``causal_blocks``. The sizes
        may be traced values (the exported graph's dynamic axes)."""
        if not self.config.causal_blocks:
            return None
        index = torch.arange(rows)
        block = index[None, :] <= index[:, None]  # [rows, rows]: a row sees itself and the rows before it
        history = torch.ones(rows, history_length, dtype=torch.bool)
        return torch.cat([history, block], dim=1)[None]

    def forward_blocks(self, x, positions, history_kvs, cross_kvs, mask=None, cross_mask=None, cross_weights=False):
        """Run packed blocks through the layers; returns [B, S, d] final-normalised states,
        and with ``cross_weights`` the last layer's head-averaged cross-attention [B, S, F]
        (``cross_mask``: see ``DrafterLayer.forward``)."""
        rope = self._rope_at(positions)
        weights = None
        for index, (layer, history_kv, cross_kv) in enumerate(zip(self.layers, history_kvs, cross_kvs)):
            if cross_weights and index == len(self.layers) - 1:
                x, weights = layer(x, rope, history_kv, cross_kv, mask, cross_mask, cross_weights=True)
            else:
                x = layer(x, rope, history_kv, cross_kv, mask, cross_mask)
        return (self.final_norm(x), weights) if cross_weights else self.final_norm(x)

    def logits(self, states: torch.Tensor) -> torch.Tensor:
        """[..., d] -> [..., shortlist or vocab] draft logits through the tied embedding.

        ``states`` is made contiguous first: a strided view (the mask positions of packed
        blocks) sends the matmul down a path 4x slower, which was a fifth of a training step.
        """
        return F.linear(states.contiguous(), self.token_embedding[self.shortlist])

    @torch.no_grad()
    def init_from_target(self, model_bin: CT2ModelFile) -> None:
        """Copy the target's embedding, positions, decoder blocks 0..L-1 and final norm."""

        def tensor(name: str) -> torch.Tensor:
            return torch.from_numpy(np.asarray(model_bin[name], dtype=np.float32).copy())

        self.token_embedding.copy_(tensor("decoder/embeddings/weight"))
        self.position_embedding.copy_(tensor("decoder/position_encodings/encodings")[: self.config.max_positions])
        # Masks start at the mean token embedding: a neutral "unknown word" input.
        self.mask_embedding.copy_(self.token_embedding.mean(0).expand_as(self.mask_embedding))
        # History states live in the target's final (normalised) space: start from identity.
        self.history_proj.weight.copy_(torch.eye(self.config.d_model).repeat(1, len(self.config.history_taps)))
        self.history_proj.bias.zero_()
        for index, layer in enumerate(self.layers):
            prefix = f"decoder/layer_{index}"
            pairs = {
                layer.self_norm: "self_attention/layer_norm",
                layer.cross_norm: "attention/layer_norm",
                layer.ffn_norm: "ffn/layer_norm",
            }
            for norm, name in pairs.items():
                norm.weight.copy_(tensor(f"{prefix}/{name}/gamma"))
                norm.bias.copy_(tensor(f"{prefix}/{name}/beta"))
            linears = {
                layer.qkv: "self_attention/linear_0",
                layer.self_out: "self_attention/linear_1",
                layer.cross_q: "attention/linear_0",
                layer.cross_kv: "attention/linear_1",
                layer.cross_out: "attention/linear_2",
                layer.fc1: "ffn/linear_0",
                layer.fc2: "ffn/linear_1",
            }
            for linear, name in linears.items():
                linear.weight.copy_(tensor(f"{prefix}/{name}/weight"))
                linear.bias.copy_(tensor(f"{prefix}/{name}/bias"))
        self.final_norm.weight.copy_(tensor("decoder/layer_norm/gamma"))
        self.final_norm.bias.copy_(tensor("decoder/layer_norm/beta"))


def block_attention_mask(
    anchor_positions: torch.Tensor, history_length: torch.Tensor, history_size: int, k: int, causal: bool = False
) -> torch.Tensor:
    """Who may attend to whom when N blocks are packed after a history of ``history_size``.

    Args:
        anchor_positions: [B, N] position t_n of each block's anchor, as an index into the
            history (history index i holds text position i + history_offset; callers pass
            t_n - history_offset).
        history_length: [B] valid history entries per row.
        history_size: T, the padded history length.
        k: draft tokens per block.
        causal: a row sees the rows of its block up to itself only (``causal_blocks``).
    Returns:
        [B, N * (K + 1), T + N * (K + 1)] boolean: block n sees history indices < t_n (and
        < history_length) and the K + 1 tokens of its own block (causal: those up to the
        row), nothing else.
    """
    batch, blocks = anchor_positions.shape
    width = k + 1
    history_index = torch.arange(history_size, device=anchor_positions.device)
    sees_history = (history_index < anchor_positions[..., None]) & (history_index < history_length[:, None, None])
    sees_history = sees_history[:, :, None, :].expand(batch, blocks, width, history_size)
    block_id = torch.arange(blocks, device=anchor_positions.device).repeat_interleave(width)
    sees_block = block_id[:, None] == block_id[None, :]
    if causal:
        row = torch.arange(blocks * width, device=anchor_positions.device)
        sees_block = sees_block & (row[None, :] <= row[:, None])
    sees_block = sees_block.expand(batch, -1, -1)
    return torch.cat([sees_history.reshape(batch, blocks * width, history_size), sees_block], dim=-1)
