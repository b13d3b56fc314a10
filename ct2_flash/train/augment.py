"""Make clean synthetic speech sound like what users record: one random chain per utterance.

In order, each step with its own probability, and every choice recorded for the manifest:

1. speed perturbation (resampling: tempo and pitch move together, 0.9-1.1x);
2. room reverberation (exponentially decaying noise, RT60 0.15-0.7 s);
3. additive noise at 5-40 dB SNR: white, pink-ish, or babble made of other utterances;
4. a channel: telephone band (8 kHz), mu-law or A-law telephony, AMR-NB, G.722, or a lossy
   MP3/Opus at a low bitrate, each a real encode/decode round trip through PyAV (FFmpeg);
5. level: a peak between -26 and -1 dBFS, sometimes with a slow gain ride.

Speech is 16 kHz int16 in and out.
"""

from __future__ import annotations

import functools
import io
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

SAMPLE_RATE = 16000

# name -> (container format, codec, codec sample rate, bit rate or None). A chain picks among
# those whose encoder this PyAV (FFmpeg) build has (``channels``).
CHANNELS = {
    "telephone": (None, None, 8000, None),
    "mulaw": ("wav", "pcm_mulaw", 8000, None),
    "alaw": ("wav", "pcm_alaw", 8000, None),
    "amr_nb": ("amr", "libopencore_amrnb", 8000, 12200),
    "g722": ("wav", "g722", 16000, 64000),
    "mp3": ("mp3", "libmp3lame", 16000, 24000),
    "opus": ("ogg", "libopus", 16000, 12000),
}


def augment(
    samples: np.ndarray, rng: np.random.Generator, babble_source: Optional[Callable[[], np.ndarray]] = None
) -> Tuple[np.ndarray, Dict[str, object]]:
    """One random augmentation chain.

    Args:
        samples: [n] int16 speech at 16 kHz.
        rng: the utterance's generator (the chain is a function of it).
        babble_source: returns another utterance ([m] int16) for babble noise; None disables babble.
    Returns:
        [n'] int16 augmented speech (n' differs from n after speed perturbation) and what was done.
    """
    audio = samples.astype(np.float32) / 32768.0
    info: Dict[str, object] = {}
    if rng.random() < 0.4:
        speed = float(rng.uniform(0.9, 1.1))
        audio = _change_speed(audio, speed)
        info["speed"] = round(speed, 3)
    if rng.random() < 0.3:
        rt60 = float(rng.uniform(0.15, 0.7))
        audio = _reverberate(audio, rt60, rng)
        info["rt60"] = round(rt60, 3)
    if rng.random() < 0.5:
        snr = float(rng.uniform(5, 40))
        kind = str(rng.choice(["white", "pink", "babble"], p=[0.3, 0.3, 0.4]))
        if kind == "babble" and babble_source is None:
            kind = "pink"
        noise = _babble(audio.size, babble_source, rng) if kind == "babble" else _noise(audio.size, kind, rng)
        speech_power = np.mean(audio**2) + 1e-10
        noise *= np.sqrt(speech_power / ((np.mean(noise**2) + 1e-12) * 10 ** (snr / 10)))
        audio = audio + noise
        info["noise"] = kind
        info["snr_db"] = round(snr, 1)
    if rng.random() < 0.35:
        channel = str(rng.choice(channels()))
        audio = through_channel(audio, channel)
        info["channel"] = channel
    peak_db = float(rng.uniform(-26, -1))
    audio = audio * (10 ** (peak_db / 20) / (np.max(np.abs(audio)) + 1e-9))
    info["peak_dbfs"] = round(peak_db, 1)
    if rng.random() < 0.2:
        depth_db = float(rng.uniform(3, 10))
        ride = 10 ** (
            depth_db / 20 * np.sin(np.linspace(0, rng.uniform(1, 4) * np.pi, audio.size) + rng.uniform(0, 6.3)) / 2
        )
        audio = np.clip(audio * ride, -1, 1)
        info["gain_ride_db"] = round(depth_db, 1)
    return np.clip(audio * 32768.0, -32768, 32767).astype(np.int16), info


def _change_speed(audio: np.ndarray, speed: float) -> np.ndarray:
    """Resample by ``speed`` (> 1: faster and higher), linear interpolation."""
    length = int(audio.size / speed)
    return np.interp(np.arange(length) * speed, np.arange(audio.size), audio).astype(np.float32)


def _reverberate(audio: np.ndarray, rt60: float, rng: np.random.Generator) -> np.ndarray:
    length = int(rt60 * SAMPLE_RATE)
    decay = np.exp(-6.9 * np.arange(length) / length)  # -60 dB at rt60
    response = rng.standard_normal(length).astype(np.float32) * decay
    response[0] = 1.0
    response /= np.sqrt(np.sum(response**2))
    # FFT convolution: a direct one costs seconds for a 30 s utterance and a long tail.
    size = 1 << int(np.ceil(np.log2(audio.size + length)))
    wet = np.fft.irfft(np.fft.rfft(audio, size) * np.fft.rfft(response, size), size)[: audio.size]
    return wet.astype(np.float32)


def _noise(size: int, kind: str, rng: np.random.Generator) -> np.ndarray:
    noise = rng.standard_normal(size).astype(np.float32)
    if kind == "pink":  # pink-ish: integrate white noise a little
        noise = np.convolve(noise, np.ones(8) / 8, mode="same").astype(np.float32)
    return noise


def _babble(size: int, source: Callable[[], np.ndarray], rng: np.random.Generator) -> np.ndarray:
    """2-5 other utterances, each at a random offset and level, looped to ``size``."""
    babble = np.zeros(size, dtype=np.float32)
    for _ in range(int(rng.integers(2, 6))):
        other = source().astype(np.float32) / 32768.0
        if other.size == 0:
            continue
        other = np.roll(np.resize(other, size), int(rng.integers(size)))
        babble += other / (np.sqrt(np.mean(other**2)) + 1e-9) * float(rng.uniform(0.5, 1.0))
    return babble


@functools.lru_cache(maxsize=None)
def channels() -> Tuple[str, ...]:
    """The names of ``CHANNELS`` this PyAV build can encode, sorted: not every wheel has every
    encoder (av 18.1.1's has no AMR-NB), and a chain must not fail on one it lacks."""
    return tuple(sorted(name for name, (_, codec, _, _) in CHANNELS.items() if codec is None or encodable(codec)))


def encodable(codec: str) -> bool:
    """Whether this PyAV build has an encoder named ``codec``."""
    import av

    try:
        av.codec.Codec(codec, "w")
    except Exception:  # PyAV's UnknownCodecError, or a codec it cannot open for writing
        return False
    return True


def through_channel(audio: np.ndarray, channel: str) -> np.ndarray:
    """A real encode/decode round trip of float audio through ``channel`` (see CHANNELS)."""
    container_format, codec, rate, bit_rate = CHANNELS[channel]
    band_limited = resample(audio, SAMPLE_RATE, rate) if rate != SAMPLE_RATE else audio
    if codec is None:
        decoded = band_limited
    else:
        decoded = _codec_round_trip(band_limited, container_format, codec, rate, bit_rate)
    out = resample(decoded, rate, SAMPLE_RATE) if rate != SAMPLE_RATE else decoded
    # Codecs add or drop a few ms of priming; keep the original length.
    return np.resize(out, audio.size) if out.size >= audio.size else np.pad(out, (0, audio.size - out.size))


def resample(audio: np.ndarray, rate_in: int, rate_out: int) -> np.ndarray:
    """[n] float audio at ``rate_in`` -> float audio at ``rate_out`` (PyAV's resampler, as faster-whisper uses)."""
    import av

    frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(audio[None], dtype=np.float32), format="flt", layout="mono")
    frame.sample_rate = rate_in
    resampler = av.AudioResampler(format="flt", layout="mono", rate=rate_out)
    frames = resampler.resample(frame) + resampler.resample(None)
    return np.concatenate([f.to_ndarray().reshape(-1) for f in frames]).astype(np.float32)


def _codec_round_trip(audio: np.ndarray, container_format: str, codec: str, rate: int, bit_rate) -> np.ndarray:
    import av

    buffer = io.BytesIO()
    with av.open(buffer, "w", format=container_format) as container:
        stream = container.add_stream(codec, rate=rate, layout="mono")
        if bit_rate:
            stream.bit_rate = bit_rate
        frame_size = stream.codec_context.frame_size or 1024
        pcm = np.clip(audio, -1, 1)
        packed = (pcm * 32767).astype(np.int16)
        input_format = "s16"
        for start in range(0, packed.size, frame_size):
            chunk = packed[start : start + frame_size]
            if chunk.size < frame_size and stream.codec_context.frame_size:
                chunk = np.pad(chunk, (0, frame_size - chunk.size))
            frame = av.AudioFrame.from_ndarray(chunk[None], format=input_format, layout="mono")
            frame.sample_rate = rate
            frame.pts = start
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    buffer.seek(0)
    with av.open(buffer) as container:
        resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
        frames: List = [f for frame in container.decode(audio=0) for f in resampler.resample(frame)]
        frames += resampler.resample(None)
    return np.concatenate([f.to_ndarray().reshape(-1) for f in frames]).astype(np.float32)
