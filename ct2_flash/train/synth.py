"""Synthesize training speech with every offline English voice this machine has (see voices.py).

Each utterance is one passage (10-30 s) spoken by one voice with random speaking settings,
then augmented (augment.py: speed, reverberation, noise or babble, a telephone or codec channel,
level). Audio is written as 16 kHz int16 ``.npy`` files, one per utterance, and a line per
finished utterance, with everything chosen for it, is appended to ``manifest.jsonl``;
utterances a voice could not speak, or that came out longer than a window, go to
``rejected.jsonl`` with the reason. A rerun skips every id in either file, so the step resumes
after an interruption, and a larger ``hours`` only synthesizes new utterances.
``synth_report.json`` counts hours per voice, channel and noise, rejections by reason, and the
voices skipped because they are not installed.

Recipes: ids ``uttNNNNNN`` came from recipe 1 (7 flite/festival voices, fortunes and numeric
templates, noise and reverberation); ids ``r2-NNNNNN`` from recipe 2 (all engines, the wider
text mix and the full augmentation chain). Both stay valid training data.

Split: the voices in ``VALIDATION_VOICES`` and 5% of the texts (by hash) are validation only.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import subprocess
from concurrent.futures import ProcessPoolExecutor
from typing import Dict, Iterator, List, Tuple

import numpy as np

from ct2_flash.train.augment import augment
from ct2_flash.train.corpus import is_validation, passages
from ct2_flash.train.voices import SAMPLE_RATE, VALIDATION_VOICES, Voice, catalogue, installed, settings, speak

MAX_SECONDS = 29.5  # one Whisper window, with room for the end timestamp
RECIPE = 2
TEXT_MIX = {
    "fortunes": 0.42,
    "packages": 0.1,
    "licenses": 0.04,
    "numbers": 0.2,
    "conversation": 0.14,
    "instructions": 0.05,
    "dialogue": 0.05,
}
REPORT_FILE = "synth_report.json"

log = logging.getLogger(__name__)


def _job(job: Tuple[str, str, str, dict, int, str, List[str]]) -> dict:
    """One utterance -> its manifest entry, or ``{"id", "rejected": reason}``."""
    utterance_id, voice_key, text, options, seed, data_dir, babble_ids = job
    engine, name = voice_key.split(":", 1)
    try:
        samples = speak(Voice(engine, name), text, options)
    except (subprocess.CalledProcessError, RuntimeError, OSError) as error:
        return {"id": utterance_id, "voice": voice_key, "rejected": f"tts failed: {type(error).__name__}"}
    if samples.size / SAMPLE_RATE > MAX_SECONDS / 1.1 or samples.size < SAMPLE_RATE:
        return {
            "id": utterance_id,
            "voice": voice_key,
            "rejected": "too long" if samples.size >= SAMPLE_RATE else "too short",
        }
    rng = np.random.default_rng(seed)
    audio_dir = os.path.join(data_dir, "audio")

    def babble() -> np.ndarray:
        other = os.path.join(audio_dir, f"{babble_ids[int(rng.integers(len(babble_ids)))]}.npy")
        try:
            return np.load(other)
        except (OSError, ValueError):
            return np.zeros(0, dtype=np.int16)

    audio, info = augment(samples, rng, babble if babble_ids else None)
    np.save(os.path.join(audio_dir, f"{utterance_id}.npy"), audio)
    split = "validation" if voice_key in VALIDATION_VOICES or is_validation(text) else "train"
    return {
        "id": utterance_id,
        "recipe": RECIPE,
        "voice": voice_key,
        **options,
        "text": text,
        "seconds": audio.size / SAMPLE_RATE,
        "split": split,
        **info,
    }


def jobs(
    data_dir: str, voices: List[Voice], weights: List[float], seed: int, babble_ids: List[str]
) -> Iterator[Tuple[str, str, str, dict, int, str, List[str]]]:
    """The endless, deterministic list of recipe-2 utterances (for one set of installed voices)."""
    texts = passages(seed, 15, 55, TEXT_MIX)
    probabilities = np.asarray(weights) / np.sum(weights)
    for index in range(10**7):
        rng = np.random.default_rng([seed, RECIPE, index])
        voice = voices[int(rng.choice(len(voices), p=probabilities))]
        options = settings(voice, rng)
        babble = (
            [babble_ids[i] for i in rng.choice(len(babble_ids), size=min(8, len(babble_ids)), replace=False)]
            if babble_ids
            else []
        )
        yield f"r{RECIPE}-{index:06d}", voice.key, next(texts), options, int(rng.integers(2**31)), data_dir, babble


def synthesize(data_dir: str, hours: float, seed: int = 0, workers: int = 2, progress: bool = True) -> List[dict]:
    """Synthesize until the manifest holds about ``hours`` of audio (resumable)."""
    from tqdm import tqdm

    os.makedirs(os.path.join(data_dir, "audio"), exist_ok=True)
    manifest_path = os.path.join(data_dir, "manifest.jsonl")
    rejected_path = os.path.join(data_dir, "rejected.jsonl")
    done, rejected = _read_ids(manifest_path), _read_ids(rejected_path)
    voices, missing = installed([voice for voice, _ in catalogue()])
    if not voices:
        raise RuntimeError(f"no voice can speak on this machine: {missing}")
    weight = dict((voice.key, w) for voice, w in catalogue())
    target_seconds = hours * 3600
    have = sum(e["seconds"] for e in done.values())
    babble_ids = sorted(e["id"] for e in done.values() if e["split"] == "train")[:2000]
    bar = tqdm(total=round(target_seconds / 3600, 2), initial=round(have / 3600, 2), unit="h", disable=not progress)
    pending = (
        job
        for job in jobs(data_dir, voices, [weight[v.key] for v in voices], seed, babble_ids)
        if job[0] not in done and job[0] not in rejected
    )
    written = 0
    with (
        ProcessPoolExecutor(max_workers=workers) as pool,
        open(manifest_path, "a", encoding="utf-8") as manifest,
        open(rejected_path, "a", encoding="utf-8") as rejects,
    ):
        # Small chunks, so that stopping at the target does not wait for a long queue.
        while have < target_seconds:
            chunk = [next(pending) for _ in range(4 * workers)]
            for result in pool.map(_job, chunk):
                if "rejected" in result:
                    rejects.write(json.dumps(result) + "\n")
                    rejects.flush()
                    rejected[result["id"]] = result
                    continue
                manifest.write(json.dumps(result) + "\n")
                manifest.flush()
                done[result["id"]] = result
                have += result["seconds"]
                written += 1
                bar.update(round(result["seconds"] / 3600, 6))
            if written >= 50:
                write_report(data_dir, done, rejected, missing)
                written = 0
    bar.close()
    write_report(data_dir, done, rejected, missing)
    return list(done.values())


def write_report(data_dir: str, done: Dict[str, dict], rejected: Dict[str, dict], missing: Dict[str, str]) -> dict:
    """Hours by voice, channel, noise and split; rejections by reason; voices not installed."""
    hours: Dict[str, Dict[str, float]] = {
        key: collections.defaultdict(float) for key in ("voice", "channel", "noise", "split", "recipe")
    }
    for entry in done.values():
        for key in hours:
            hours[key][str(entry.get(key, "none" if key != "recipe" else 1))] += entry["seconds"] / 3600
    report = {
        "utterances": len(done),
        "hours": round(sum(e["seconds"] for e in done.values()) / 3600, 3),
        "hours_by": {key: {k: round(v, 3) for k, v in sorted(values.items())} for key, values in hours.items()},
        "rejected": dict(collections.Counter(e["rejected"] for e in rejected.values())),
        "voices_not_installed": missing,
    }
    path = os.path.join(data_dir, REPORT_FILE)
    with open(path + ".tmp", "w", encoding="utf-8") as stream:
        json.dump(report, stream, indent=2)
    os.replace(path + ".tmp", path)
    return report


def _read_ids(path: str) -> Dict[str, dict]:
    """JSON lines keyed by their "id" (empty if the file does not exist yet)."""
    entries: Dict[str, dict] = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as stream:
            for line in stream:
                entry = json.loads(line)
                entries[entry["id"]] = entry
    return entries
