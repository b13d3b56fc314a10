"""Teacher extraction: what the frozen target does on every synthesized utterance.

For each utterance: the encoder output of its (single) window, the target's own greedy tokens
for a faster-whisper prompt (timestamps on for half of the utterances, off for the others, as
users run both), and the target's final decoder states at the last prompt position and at
every generated position, recovered from teacher-forced logits exactly as the decode loop
recovers them at run time; the target's top-16 next-token distribution at each of those
positions (for distillation); the audio frame the target reads for each token (the peak of
its alignment heads' cross-attention, the position an AnchorDraft loss supervises); and how
many encoder frames hold audio (the drafter reads those
and one second of the padding, at run time as in training; a training utterance stores only
those frames). Stored per utterance as
``teacher/<id>.npz`` (float16 arrays); ``teacher.jsonl`` lists the finished ones, so the step
resumes.

The drafter learns the target's greedy continuation, not the reference text: that is what it
will be asked to predict.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Dict, List

import numpy as np

from ct2_flash.adapter.audio import audio_frames
from ct2_flash.drafting.audio_window import PADDING_FRAMES_SEEN


def prompt_for(utterance_id: str, special) -> List[int]:
    """Timestamps on or off, chosen by a stable hash of the id."""
    with_timestamps = hashlib.sha1(utterance_id.encode()).digest()[0] % 2 == 0
    return [special.sot] if with_timestamps else [special.sot, special.no_timestamps]


def extract(
    data_dir: str,
    model_name: str = "tiny.en",
    compute_type: str = "float32",
    threads: int = 2,
    progress: bool = True,
    batch_size: int = 8,
) -> int:
    """Extract teacher data for every synthesized utterance not done yet; returns the count.

    The encoder and the greedy decoding run on ``batch_size`` utterances at once (per prompt
    kind): on these CPUs one batched call costs far less than as many single ones, and they
    were most of the step. What is stored per position comes from each utterance's own
    teacher-forced pass.
    """
    from tqdm import tqdm

    from ct2_flash.adapter.whisper_model import FlashWhisperModel

    model = FlashWhisperModel(model_name, stock_engine=False, compute_type=compute_type, cpu_threads=threads)
    runtime = model.decoder.runtime
    special = runtime.special
    out_dir = os.path.join(data_dir, "teacher")
    os.makedirs(out_dir, exist_ok=True)
    done_path = os.path.join(data_dir, "teacher.jsonl")
    done = set()
    if os.path.exists(done_path):
        with open(done_path, encoding="utf-8") as stream:
            done = {json.loads(line)["id"] for line in stream}
    with open(os.path.join(data_dir, "manifest.jsonl"), encoding="utf-8") as stream:
        entries = [json.loads(line) for line in stream]
    pending = [e for e in entries if e["id"] not in done]
    with (
        open(done_path, "a", encoding="utf-8") as log,
        tqdm(total=len(pending), desc="teacher", disable=not progress) as bar,
    ):
        for start in range(0, len(pending), batch_size):
            chunk = pending[start : start + batch_size]
            for prompt in {tuple(prompt_for(e["id"], special)) for e in chunk}:
                group = [e for e in chunk if tuple(prompt_for(e["id"], special)) == prompt]
                for record in _extract_group(model, runtime, special, data_dir, out_dir, group, list(prompt)):
                    log.write(json.dumps(record) + "\n")
                log.flush()
            bar.update(len(chunk))
    return len(pending)


TOP_K = 16  # teacher distribution kept per position: the rest of the mass is negligible for tiny.en


def attended_frames(runtime, encoder_output, prompt: List[int], tokens: List[int]) -> np.ndarray:
    """[len(tokens)] int16: for each token, the encoder frame the target's alignment heads
    attend to most when predicting it (head-averaged, post-softmax cross-attention).

    A second pass after the teacher's logits, with the runtime's position tracking (its heads,
    its check that the model has them) switched on only for it.
    """
    tracking = runtime.tracking_positions
    runtime.track_positions(True)
    try:
        state, _, first = runtime.model.prefill_with_attention(encoder_output, prompt)
        first = np.asarray(first)  # [1, heads, frames]
        rows = [first.reshape(-1, first.shape[-1]).mean(axis=0)[None]]
        if len(tokens) > 1:
            _, attention = runtime.model.forward_batch_with_attention(state, [int(t) for t in tokens[:-1]])
            rows.append(np.asarray(attention))
    finally:
        runtime.track_positions(tracking)
    return np.concatenate(rows).argmax(axis=1).astype(np.int16)


def _extract_group(
    model, runtime, special, data_dir: str, out_dir: str, entries: List[Dict], prompt: List[int]
) -> List[Dict]:
    """Teacher data for utterances that share ``prompt``: one batched encoder and greedy call."""
    from ctranslate2 import StorageView

    features = np.stack(
        [
            model.window_features(
                np.load(os.path.join(data_dir, "audio", f"{e['id']}.npy")).astype(np.float32) / 32768.0
            )
            for e in entries
        ]
    )
    encoded = model.reference_model.encode(StorageView.from_array(np.ascontiguousarray(features)))
    results = model.reference_model.generate(
        encoded, [prompt] * len(entries), beam_size=1, max_initial_timestamp_index=50
    )
    encoded = np.asarray(encoded)  # [n, frames, d]
    return [
        _extract_one(
            runtime,
            special,
            out_dir,
            entry,
            features[i],
            StorageView.from_array(encoded[i : i + 1].copy()),
            prompt,
            list(result.sequences_ids[0]),
            model,
        )
        for i, (entry, result) in enumerate(zip(entries, results))
    ]


def _extract_one(
    runtime,
    special,
    out_dir: str,
    entry: Dict,
    features: np.ndarray,
    encoder_output,
    prompt: List[int],
    tokens: List[int],
    model,
) -> Dict:

    ended = len(tokens) < 224  # stopped on end-of-text, not on the budget
    full = tokens + ([special.eot] if ended else [])
    prefill = runtime.start(encoder_output, prompt)
    rows = [prefill.next_logits[None]]
    if len(full) > 1:
        rows.append(prefill.sequence.verify(full[:-1]))
    logits = np.concatenate(rows)  # [len(full), vocab] raw: row i predicts full[i]
    states = runtime.decoder_states(logits)  # [len(full), d]: positions before each target
    log_probs = logits - logits.max(axis=1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(axis=1, keepdims=True))
    top = np.argpartition(-log_probs, TOP_K, axis=1)[:, :TOP_K]  # [len(full), TOP_K]
    frames = audio_frames(features[None])[0]
    encoded = np.asarray(encoder_output)[0]
    if entry["split"] == "train":
        # Training reads only the frames the runtime drafter reads (fit.drafter_frames); the
        # validation windows keep all of them, as the target verifies against all of them.
        encoded = encoded[: min(len(encoded), frames + PADDING_FRAMES_SEEN)]
    np.savez(
        os.path.join(out_dir, f"{entry['id']}.npz"),
        encoder_output=encoded.astype(np.float16),
        states=states.astype(np.float16),
        tokens=np.asarray(full, dtype=np.int32),
        prompt=np.asarray(prompt, dtype=np.int32),
        top_ids=top.astype(np.int32),
        top_log_probs=np.take_along_axis(log_probs, top, axis=1).astype(np.float16),
        audio_frames=np.asarray(frames, dtype=np.int32),
        attended_frames=attended_frames(runtime, encoder_output, prompt, full),
    )
    text = model.hf_tokenizer.decode([t for t in tokens if t < special.eot])
    return {
        "id": entry["id"],
        "split": entry["split"],
        "voice": entry["voice"],
        "tokens": len(full),
        "timestamps": len(prompt) == 1,
        "hypothesis": text.strip(),
        "reference": entry["text"],
    }
