"""Held-out synthetic utterances as a benchmark manifest (WAV files + ``manifest.tsv``).

Training picks its checkpoint on the first ``skip`` validation utterances; reporting on those
would flatter the drafter, so the export starts after them.
"""

from __future__ import annotations

import json
import os
import wave

import numpy as np

from ct2_flash.benchmark.manifest import Utterance, write_manifest
from ct2_flash.train.synth import SAMPLE_RATE


def export_validation(data_dir: str, out_dir: str, skip: int, count: int) -> str:
    """Write validation utterances ``skip`` .. ``skip + count`` as 16 kHz WAV; returns the manifest."""
    with open(os.path.join(data_dir, "teacher.jsonl"), encoding="utf-8") as stream:
        records = [r for r in map(json.loads, stream) if r["split"] == "validation"]
    with open(os.path.join(data_dir, "manifest.jsonl"), encoding="utf-8") as stream:
        texts = {r["id"]: r["text"] for r in map(json.loads, stream)}
    chosen = records[skip : skip + count]
    if not chosen:
        raise ValueError(f"no validation utterances after the first {skip} in {data_dir}")
    os.makedirs(out_dir, exist_ok=True)
    utterances = []
    for record in chosen:
        samples = np.load(os.path.join(data_dir, "audio", f"{record['id']}.npy")).astype(np.int16)
        path = os.path.join(out_dir, f"{record['id']}.wav")
        with wave.open(path, "wb") as out:
            out.setnchannels(1)
            out.setsampwidth(2)
            out.setframerate(SAMPLE_RATE)
            out.writeframes(samples.tobytes())
        utterances.append(Utterance(path, texts[record["id"]]))
    manifest = os.path.join(out_dir, "manifest.tsv")
    write_manifest(manifest, utterances)
    return manifest
