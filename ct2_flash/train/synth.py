"""Synthesize training speech with the offline voices of Debian (flite, festival).

Each utterance is one passage (10-30 s) spoken by one voice at one speaking rate, then lightly
augmented (gain, background noise at 10-40 dB SNR, synthetic room reverberation). Audio is
written as 16 kHz int16 ``.npy`` files, one per utterance, and a line per finished utterance
is appended to ``manifest.jsonl``; utterances the voice could not speak or that came out longer
than a window are appended to ``rejected.jsonl``. A rerun skips every id in either file, so the
step resumes after an interruption and a larger ``hours`` only synthesizes new utterances.

Split: the voice ``festival:ked_diphone`` and 5% of the texts (by hash) are validation only.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Dict, Iterator, List, Tuple

import numpy as np

from .corpus import is_validation, passages

SAMPLE_RATE = 16000
MAX_SECONDS = 29.5  # one Whisper window, with room for the end timestamp


@dataclass(frozen=True)
class Voice:
    engine: str  # "flite" or "festival"
    name: str

    @property
    def key(self) -> str:
        return f"{self.engine}:{self.name}"


VOICES = [
    Voice("flite", "kal16"), Voice("flite", "awb"), Voice("flite", "rms"), Voice("flite", "slt"),
    Voice("festival", "kal_diphone"), Voice("festival", "cmu_us_slt_arctic_hts"),
    Voice("festival", "ked_diphone"),
]
VALIDATION_VOICES = {"festival:ked_diphone"}


def read_wav(path: str) -> np.ndarray:
    """Any audio file -> 16 kHz mono int16 (PyAV, as faster-whisper decodes)."""
    import av

    with av.open(path) as container:
        resampler = av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)
        frames = [f for frame in container.decode(audio=0) for f in resampler.resample(frame)]
        frames += resampler.resample(None)
    return np.concatenate([f.to_ndarray().reshape(-1) for f in frames]).astype(np.int16)


def speak(voice: Voice, text: str, stretch: float = 1.0) -> np.ndarray:
    """Text -> 16 kHz int16 speech. ``stretch`` > 1 speaks slower."""
    with tempfile.TemporaryDirectory() as tmp:
        wav = os.path.join(tmp, "speech.wav")
        if voice.engine == "flite":
            command = ["flite", "-voice", voice.name, "--setf", f"duration_stretch={stretch:.3f}", "-t", text, "-o", wav]
            subprocess.run(command, check=True, capture_output=True)
        elif voice.engine == "festival":
            setup = f"(begin (voice_{voice.name}) (Parameter.set 'Duration_Stretch {stretch:.3f}))"
            subprocess.run(["text2wave", "-eval", setup, "-o", wav], input=text.encode(), check=True, capture_output=True)
        else:
            raise ValueError(f"unknown TTS engine {voice.engine}")
        return read_wav(wav)


def augment(samples: np.ndarray, rng: np.random.Generator) -> Tuple[np.ndarray, Dict[str, float]]:
    """Gain, optional reverberation and optional noise; returns int16 audio and what was done."""
    audio = samples.astype(np.float32) / 32768.0
    info: Dict[str, float] = {}
    if rng.random() < 0.3:
        rt60 = float(rng.uniform(0.15, 0.6))
        length = int(rt60 * SAMPLE_RATE)
        decay = np.exp(-6.9 * np.arange(length) / length)  # -60 dB at rt60
        response = rng.standard_normal(length).astype(np.float32) * decay
        response[0] = 1.0
        response /= np.sqrt(np.sum(response**2))
        audio = np.convolve(audio, response)[: audio.size].astype(np.float32)
        info["rt60"] = rt60
    if rng.random() < 0.5:
        snr = float(rng.uniform(10, 40))
        noise = rng.standard_normal(audio.size).astype(np.float32)
        if rng.random() < 0.5:  # pink-ish: integrate white noise a little
            noise = np.convolve(noise, np.ones(8) / 8, mode="same")
        speech_power = np.mean(audio**2) + 1e-10
        noise *= np.sqrt(speech_power / (np.mean(noise**2) * 10 ** (snr / 10)))
        audio = audio + noise
        info["snr_db"] = snr
    peak = np.max(np.abs(audio)) + 1e-9
    gain = float(rng.uniform(0.2, 0.9) / peak)
    info["gain"] = gain
    return np.clip(audio * gain * 32768.0, -32768, 32767).astype(np.int16), info


def _job(job: Tuple[int, str, str, float, int, str]) -> dict:
    """One utterance -> its manifest entry, or ``{"id", "rejected": reason}``."""
    index, voice_key, text, stretch, seed, out_dir = job
    engine, name = voice_key.split(":")
    utterance_id = f"utt{index:06d}"
    try:
        samples = speak(Voice(engine, name), text, stretch)
    except subprocess.CalledProcessError:
        return {"id": utterance_id, "rejected": "tts failed"}
    if samples.size / SAMPLE_RATE > MAX_SECONDS or samples.size < SAMPLE_RATE:
        return {"id": utterance_id, "rejected": f"{samples.size / SAMPLE_RATE:.1f} s"}
    audio, info = augment(samples, np.random.default_rng(seed))
    np.save(os.path.join(out_dir, f"{utterance_id}.npy"), audio)
    split = "validation" if voice_key in VALIDATION_VOICES or is_validation(text) else "train"
    return {"id": utterance_id, "voice": voice_key, "stretch": stretch, "text": text,
            "seconds": audio.size / SAMPLE_RATE, "split": split, **info}


def jobs(out_dir: str, count: int, seed: int) -> Iterator[Tuple[int, str, str, float, int, str]]:
    """The deterministic list of utterances: the same seed always gives the same corpus."""
    rng = np.random.default_rng(seed)
    texts = passages(seed)
    for index in range(count):
        voice = VOICES[int(rng.integers(len(VOICES)))]
        stretch = float(rng.uniform(0.8, 1.25))
        yield index, voice.key, next(texts), stretch, int(rng.integers(2**31)), out_dir


def synthesize(data_dir: str, hours: float, seed: int = 0, workers: int = 2, progress: bool = True) -> List[dict]:
    """Synthesize until the manifest holds about ``hours`` of audio (resumable)."""
    from tqdm import tqdm

    out_dir = os.path.join(data_dir, "audio")
    os.makedirs(out_dir, exist_ok=True)
    manifest_path = os.path.join(data_dir, "manifest.jsonl")
    rejected_path = os.path.join(data_dir, "rejected.jsonl")
    done, rejected = _read_ids(manifest_path), _read_ids(rejected_path)
    # ~18 s per utterance on average; ask for more and stop at the target.
    target_seconds = hours * 3600
    have = sum(e["seconds"] for e in done.values())
    count = int(target_seconds / 12) + 64
    pending = [job for job in jobs(out_dir, count, seed) if f"utt{job[0]:06d}" not in done.keys() | rejected.keys()]
    bar = tqdm(total=round(target_seconds / 3600, 2), initial=round(have / 3600, 2), unit="h", disable=not progress)
    with ProcessPoolExecutor(max_workers=workers) as pool, open(manifest_path, "a", encoding="utf-8") as manifest, \
            open(rejected_path, "a", encoding="utf-8") as rejects:
        # Small chunks, so that stopping at the target does not wait for a long queue.
        for start in range(0, len(pending), 8 * workers):
            if have >= target_seconds:
                break
            for result in pool.map(_job, pending[start : start + 8 * workers]):
                if "rejected" in result:
                    rejects.write(json.dumps(result) + "\n")
                    rejects.flush()
                    continue
                manifest.write(json.dumps(result) + "\n")
                manifest.flush()
                done[result["id"]] = result
                have += result["seconds"]
                bar.update(round(result["seconds"] / 3600, 6))
    bar.close()
    return list(done.values())


def _read_ids(path: str) -> Dict[str, dict]:
    """JSON lines keyed by their "id" (empty if the file does not exist yet)."""
    entries: Dict[str, dict] = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as stream:
            for line in stream:
                entry = json.loads(line)
                entries[entry["id"]] = entry
    return entries
