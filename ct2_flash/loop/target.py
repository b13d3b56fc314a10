"""The frozen Whisper target on the patched CTranslate2 runtime.

This module is the only owner of decoder state. ``TargetRuntime`` wraps one loaded
``ctranslate2.models.Whisper``; ``TargetRuntime.start`` prefills a prompt and returns a
``TargetSequence`` that verifies blocks of tokens in one pass and rolls its KV cache back.

Prefill mirrors CTranslate2's own ``generate()`` (``src/models/whisper.cc``): the tokens before
the decoder start token go through one batched forward, the start token and any forced prefix
through single steps. Keeping the same split keeps the computation, and so the floating point,
as close as possible to what plain faster-whisper runs.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import ctranslate2
import numpy as np
from threadpoolctl import ThreadpoolController

from ct2_flash.engine.deferred_model import load_before_timing
from ct2_flash.engine.model_files import CT2ModelFile
from ct2_flash.loop.logit_rules import SpecialTokens

# Rows of the tied embedding used to recover decoder states from logits. Any d_model
# independent rows determine the state exactly; 1024 make the solve well conditioned at a small
# fraction of the full-vocabulary solve's cost (the figures: docs/measurements.md, "Figures behind the code's constants").
STATE_RECOVERY_ROWS = 1024


@dataclass(frozen=True)
class PromptLayout:
    """Where the parts of a Whisper prompt are (CTranslate2 ``check_prompts``).

    ``prompt[:start_index]`` is the context forwarded in one batch, ``prompt[start_index]`` the
    decoder start token, ``prompt[start_index + 1:]`` the forced prefix.
    """

    sot_index: int
    start_index: int
    length: int

    @classmethod
    def of(cls, prompt: Sequence[int], special: SpecialTokens) -> "PromptLayout":
        try:
            sot_index = list(prompt).index(special.sot)
        except ValueError:
            raise ValueError("<|startoftranscript|> token was not found in the prompt") from None
        end = sot_index
        while end < len(prompt) and special.sot <= prompt[end] <= special.no_timestamps:
            end += 1
        return cls(sot_index=sot_index, start_index=end - 1, length=len(prompt))

    @property
    def prefix_length(self) -> int:
        return self.length - self.start_index - 1

    def max_steps(self, max_length: int) -> int:
        """CTranslate2's greedy budget: tokens after the decoder start token (forced prefix
        and end of text included) a call with ``max_length`` may produce."""
        return min(max_length // 2, max_length - self.start_index)

    def max_length_for(self, steps: int) -> int:
        """The ``max_length`` whose greedy budget (``max_steps``) is ``steps`` tokens (>= 1)."""
        return max(2 * steps, steps + self.start_index)


@dataclass
class PrefillResult:
    """What the prompt gives before the first generated token.

    Attributes:
        sequence: the decoder state holder, positioned after the whole prompt.
        sot_logits: [vocab] raw logits at the start-of-transcript position (no-speech prob).
        next_logits: [vocab] raw logits at the last prompt position (first generated token).
    """

    sequence: "TargetSequence"
    sot_logits: np.ndarray
    next_logits: np.ndarray


class TargetSequence:
    """One decoder state: a KV cache over ``length`` positions that grows and rolls back.

    With ``track_positions``, every verification also reads the alignment heads' attention
    (the engine returns it from the same pass, with bit-identical logits) and keeps, per
    verified row, the encoder frame it attended to most: ``attention_peaks``.
    """

    def __init__(self, model, state, track_positions: bool = False) -> None:
        self._model = model
        self._state = state
        self._track = track_positions
        self.attention_peaks: Optional[np.ndarray] = None  # [T] of the last verification

    @property
    def length(self) -> int:
        """Number of positions in the KV cache."""
        return int(self._state.current_step)

    def verify(self, tokens: Sequence[int]) -> np.ndarray:
        """Process ``tokens`` at positions ``length .. length + T - 1`` in one pass.

        Returns:
            [T, vocab] float32 raw logits; row j predicts the token after ``tokens[j]``.
        """
        tokens = [int(t) for t in tokens]
        if self._track:
            if len(tokens) == 1:
                logits, attention = self._model.forward_step_with_attention(self._state, tokens[0])
            else:
                logits, attention = self._model.forward_batch_with_attention(self._state, tokens)
            self.attention_peaks = host_array(attention).reshape(len(tokens), -1).argmax(axis=1)
        elif len(tokens) == 1:
            # forward_batch([t]) equals forward_step(t) bit for bit; the step is cheaper.
            logits = self._model.forward_step(self._state, tokens[0])
        else:
            logits = self._model.forward_batch(self._state, tokens)
        # No copy (on CPU): the array views the pass's own output buffer, which it keeps alive
        # (its base is the StorageView) and which no later call reuses or reads, so the logit
        # rules may edit it in place. A copy of a 9-row block was a full cache-cold pass over
        # it every round.
        return host_array(logits).reshape(len(tokens), -1)

    def rollback(self, length: int) -> None:
        """Keep the first ``length`` cache positions (1 <= length <= self.length)."""
        if not 1 <= length <= self.length:
            raise ValueError(f"cannot roll back a cache of {self.length} positions to {length}")
        if length < self.length:
            self._state.truncate_to_step(length)


class TargetRuntime:
    """The frozen target: encoder, prefill, and decoder-state recovery for one loaded model.

    Args:
        model: a loaded ``ctranslate2.models.Whisper`` from the patched runtime.
        model_path: its directory (for ``model.bin`` and ``vocabulary.txt``/``tokenizer.json``).
        special: the special-token ids of its vocabulary.
        suppress_ids: the model's default ``suppress_ids`` (config.json), used for ``-1``.
        suppress_ids_begin: the model's ``suppress_ids_begin`` (config.json).
    """

    def __init__(
        self,
        model,
        model_path: str,
        special: SpecialTokens,
        suppress_ids: Sequence[int],
        suppress_ids_begin: Sequence[int],
    ) -> None:
        self.model = model
        self.model_path = model_path
        self.special = special
        self.suppress_ids = tuple(int(i) for i in suppress_ids)
        self.suppress_ids_begin = tuple(int(i) for i in suppress_ids_begin)
        self.tracking_positions = False
        self._recovery_rows: Optional[np.ndarray] = None
        self._recovery_pinv: Optional[np.ndarray] = None  # [rows, d_model]: pinv(E[rows]).T
        self._blas = None  # numpy's BLAS thread pools, limited to one thread per recovery

    def track_positions(self, enabled: bool) -> None:
        """Collect the alignment heads' attention with every verification from now on (see
        ``TargetSequence``), or stop. The heads are the model's (``alignment_heads`` in its
        config.json); a model without them cannot track and raises ValueError."""
        if enabled == self.tracking_positions:
            return
        heads: List[Tuple[int, int]] = []
        if enabled:
            with open(os.path.join(self.model_path, "config.json"), encoding="utf-8") as stream:
                heads = [tuple(h) for h in json.load(stream).get("alignment_heads") or ()]
            if not heads:
                raise ValueError(f"{self.model_path}/config.json names no alignment_heads: positions cannot be tracked")
        self.model.set_alignment_heads(heads)
        self.tracking_positions = enabled

    def start(self, encoder_output, prompt: Sequence[int]) -> PrefillResult:
        """Prefill ``prompt`` against one window's encoder output.

        Args:
            encoder_output: StorageView [1, frames, d_model] from ``encode``.
            prompt: full Whisper prompt (previous text, start-of-transcript, task tokens, prefix).
        """
        prompt = [int(t) for t in prompt]
        layout = PromptLayout.of(prompt, self.special)
        context = prompt[: layout.start_index]
        steps = prompt[layout.start_index :]
        sot_logits = None
        if context:
            if layout.sot_index < len(context) - 1:
                # Multilingual task tokens follow <|startoftranscript|>: its logits are needed
                # for the no-speech probability, so the context is forwarded in two parts.
                state, logits = self.model.prefill(encoder_output, context[: layout.sot_index + 1])
                sot_logits = _row(logits)
                self.model.forward_batch(state, context[layout.sot_index + 1 :])
            else:
                state, logits = self.model.prefill(encoder_output, context)
                if layout.sot_index == len(context) - 1:
                    sot_logits = _row(logits)
        else:
            state, logits = self.model.prefill(encoder_output, steps[:1])
            steps = steps[1:]
            sot_logits = _row(logits)  # the start token is <|startoftranscript|> itself
        for token in steps:
            logits = self.model.forward_step(state, token)
            if sot_logits is None:
                sot_logits = _row(logits)
        return PrefillResult(TargetSequence(self.model, state, self.tracking_positions), sot_logits, _row(logits))

    def no_speech_prob(self, sot_logits: np.ndarray) -> float:
        """Softmax probability of <|nospeech|> from raw start-of-transcript logits [vocab]."""
        shifted = sot_logits.astype(np.float32) - np.max(sot_logits)
        probs = np.exp(shifted)
        return float(probs[self.special.no_speech] / np.sum(probs))

    def decoder_states(self, logits: np.ndarray) -> np.ndarray:
        """Recover final (post-LayerNorm) decoder states from raw logits.

        Whisper's output layer is the token embedding without bias, so logits = h @ E^T and h
        is the least-squares solution on a fixed subset of embedding rows.

        Args:
            logits: [n, vocab] raw logits.

        Returns:
            [n, d_model] float32 decoder states.
        """
        return self.states_from_columns(self.state_columns(logits))

    def state_columns(self, logits: np.ndarray) -> np.ndarray:
        """[n, vocab] raw logits -> [n, STATE_RECOVERY_ROWS] the columns the states are solved
        from (taken before the logit rules edit the rows in place)."""
        self.prepare_recovery()
        return logits[:, self._recovery_rows]

    def states_from_columns(self, columns: np.ndarray) -> np.ndarray:
        """[n, STATE_RECOVERY_ROWS] columns of raw logits -> [n, d_model] float32 states."""
        self.prepare_recovery()
        # One thread: right after a CTranslate2 call its OpenMP workers still spin on the
        # cores, and numpy's multithreaded BLAS fighting them made this small product a
        # hundred times slower (docs/measurements.md, "Figures behind the code's constants").
        with self._blas.limit(limits=1):
            return np.asarray(columns, dtype=np.float32) @ self._recovery_pinv

    def prepare(self, recovery: bool) -> None:
        """What the loop's first pass would otherwise pay for inside it, done now (nothing
        once done): load a model deferred until its first use (``engine.deferred_model``),
        and with ``recovery`` solve the state recovery."""
        load_before_timing(self.model)
        if recovery:
            self.prepare_recovery()

    def prepare_recovery(self) -> None:
        """Choose the recovery rows and solve their pseudo-inverse (once; a fraction of a
        second for tiny.en). The model does it when it is built, so that no decoded window
        pays for it."""
        if self._recovery_pinv is not None:
            return
        rng = np.random.default_rng(0)
        rows = np.sort(rng.choice(self.special.eot, size=STATE_RECOVERY_ROWS, replace=False))
        self._recovery_rows = rows
        self._recovery_pinv = np.ascontiguousarray(pseudo_inverse(self.embedding(rows)).T, dtype=np.float32)
        self._blas = ThreadpoolController().select(user_api="blas")

    def embedding(self, rows: Optional[np.ndarray] = None) -> np.ndarray:
        """[vocab, d_model] float32 token embedding (the tied output projection), or only
        ``rows`` of it ([len(rows), d_model]): read from the mapped file, so that the rest of
        the vocabulary is neither read nor converted."""
        embedding = CT2ModelFile(self.model_path)["decoder/embeddings/weight"]
        return np.asarray(embedding if rows is None else embedding[rows], dtype=np.float32)


def pseudo_inverse(matrix: np.ndarray) -> np.ndarray:
    """The pseudo-inverse of an [n, d] matrix (float64): through the normal equations where
    they hold (n >= d and the product with the matrix is the identity to 1e-9), else by an SVD.
    They take a fraction of the SVD's time for the recovery rows (the first speculative call
    pays it) and agree with it far below float32's resolution (the figures: docs/measurements.md,
    "Figures behind the code's constants")."""
    matrix = np.asarray(matrix, dtype=np.float64)
    if matrix.shape[0] >= matrix.shape[1]:
        try:
            inverse = np.linalg.solve(matrix.T @ matrix, matrix.T)
        except np.linalg.LinAlgError:  # singular: the SVD's minimum-norm answer
            inverse = None
        if inverse is not None and np.abs(inverse @ matrix - np.eye(matrix.shape[1])).max() <= 1e-9:
            return inverse
    return np.linalg.pinv(matrix)


def host_array(view) -> np.ndarray:
    """A StorageView's values as a float32 array in host memory, any shape.

    A float32 StorageView on the CPU (the loop's case there) is viewed, no copy. Another
    dtype (float16 or bfloat16 on a GPU) is converted where it lives, and values on a GPU are
    copied to the host (numpy cannot read device memory): one copy per call the loop reads.
    An array already in host memory (a stand-in runtime's) is taken as it is.
    """
    if isinstance(view, np.ndarray):
        return view.astype(np.float32, copy=False)
    if view.dtype != ctranslate2.DataType.float32:
        view = view.to(ctranslate2.DataType.float32)
    if view.device != "cpu":
        view = view.to_device(ctranslate2.Device.cpu)
    return np.asarray(view, dtype=np.float32)


def on_device_of(array: np.ndarray, like):
    """A host float32 array as a StorageView where ``like`` (a StorageView) lives: the same
    device and dtype, so that the engine takes it as it took ``like``. CTranslate2 copies to
    the current CUDA device, GPU 0 unless set otherwise: checked on one GPU only."""
    view = ctranslate2.StorageView.from_array(np.ascontiguousarray(array, dtype=np.float32))
    if like.device == "cpu":
        return view
    view = view.to_device(ctranslate2.Device.cuda)
    return view if like.dtype == ctranslate2.DataType.float32 else view.to(like.dtype)


def _row(logits) -> np.ndarray:
    """Copy the last position of a [1, vocab] or [1, T, vocab] StorageView into a [vocab] array."""
    array = host_array(logits)
    return np.array(array.reshape(-1, array.shape[-1])[-1], dtype=np.float32)
