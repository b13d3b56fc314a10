"""Synthesize the committed test speech (tests/data/*.ogg) and the bundled demo sample.

Run once by a developer with Debian's ``flite`` and ``ffmpeg``-free PyAV; the outputs are
committed so tests never need a TTS engine. Texts are plain English written for this project,
with numbers and names so the model has something to get wrong.

    python scripts/make_test_audio.py
"""

from __future__ import annotations

import os
import subprocess
import tempfile

import av
import numpy as np

CLIPS = [
    ("kal16", "Hello there."),
    ("slt", "The quick brown fox jumps over the lazy dog."),
    ("awb", "Please call Stella and ask her to bring these things with her from the store."),
    ("rms", "Six spoons of fresh snow peas, five thick slabs of blue cheese, and maybe a snack for her brother Bob."),
    (
        "slt",
        "The birch canoe slid on the smooth planks. Glue the sheet to the dark blue background. It is easy to tell the depth of a well.",
    ),
    (
        "kal16",
        "On March the fourth, nineteen ninety eight, the committee met in Boston to discuss a budget of two point five million dollars.",
    ),
    (
        "awb",
        "Doctor Alvarez told the patient to take two tablets every eight hours, and to come back on Tuesday if the fever did not go down.",
    ),
    (
        "rms",
        "We drove north along the coast for three days. The road was narrow and the weather was cold, but the views over the water were worth every mile.",
    ),
    (
        "slt",
        "A large size in stockings is hard to sell. The boy was there when the sun rose. A rod is used to catch pink salmon. The source of the huge river is the clear spring. Kick the ball straight and follow through.",
    ),
    (
        "kal16",
        "The train to Edinburgh leaves platform nine at a quarter past eleven. Passengers travelling to Glasgow should change at Carlisle, where a connecting service departs twenty minutes later. Refreshments are available in coach C.",
    ),
    (
        "awb",
        "Our quarterly report shows revenue of forty two million, an increase of eleven percent over last year. Most of the growth came from the new European offices in Paris, Berlin and Madrid. We expect the trend to continue into the next quarter, although currency risks remain.",
    ),
    (
        "rms",
        "Help the woman get back to her feet. A pot of tea helps to pass the evening. Smoky fires lack flame and heat. The soft cushion broke the man's fall. The salt breeze came across from the sea. The girl at the booth sold fifty bonds. The small pup gnawed a hole in the sock.",
    ),
    (
        "awb",
        "The museum opens at nine in the morning and closes at half past five, except on Thursdays, when it stays open until eight. Tickets cost twelve euros for adults and six for children under sixteen. Guided tours in English start every hour from the main hall, and the audio guide is available in eleven languages, including Japanese, Portuguese and Polish. Please leave large bags in the cloakroom.",
    ),
    (
        "slt",
        "In the beginning the project had only two engineers, a borrowed laptop, and a very small budget. They wrote the first prototype in six weeks, tested it with twenty volunteers from the local library, and rewrote most of it after listening to their complaints. By the end of the year the tool was used by more than four thousand people in nine countries. Today it has a team of thirty, an office in Lisbon, and a waiting list of customers.",
    ),
]
LONG_TEXT = " ".join(text for _, text in CLIPS[4:12])
SAMPLE_TEXT = (
    "Speculative decoding lets a small model guess several words ahead. "
    "The large model checks all of the guesses in a single pass and keeps the ones it agrees with, "
    "so the transcript is exactly the same, only faster. "
    "This sample was synthesized on the fly for the ct2 flash demo."
)
SAMPLE_RATE = 16000


def synthesize(voice: str, text: str) -> np.ndarray:
    with tempfile.TemporaryDirectory() as tmp:
        wav = os.path.join(tmp, "out.wav")
        subprocess.run(["flite", "-voice", voice, "-t", text, "-o", wav], check=True)
        with av.open(wav) as container:
            resampler = av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)
            frames = [f for frame in container.decode(audio=0) for f in resampler.resample(frame)]
            frames += resampler.resample(None)
        return np.concatenate([f.to_ndarray().reshape(-1) for f in frames])


def write_ogg(path: str, samples: np.ndarray) -> None:
    with av.open(path, "w", format="ogg") as container:
        stream = container.add_stream("libopus", rate=48000)
        stream.bit_rate = 32000
        resampler = av.AudioResampler(format="s16", layout="mono", rate=48000)
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1).astype(np.int16), format="s16", layout="mono")
        frame.sample_rate = SAMPLE_RATE
        for resampled in resampler.resample(frame) + resampler.resample(None):
            for packet in stream.encode(resampled):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)


def main() -> None:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    data = os.path.join(root, "tests", "data")
    os.makedirs(data, exist_ok=True)
    silence = np.zeros(SAMPLE_RATE // 2, dtype=np.int16)
    for index, (voice, text) in enumerate(CLIPS):
        write_ogg(
            os.path.join(data, f"clip{index:02d}_{voice}.ogg"),
            np.concatenate([silence, synthesize(voice, text), silence]),
        )
    voices = ["slt", "rms", "awb", "kal16"]
    parts = []
    for index, (_, text) in enumerate(CLIPS[4:12]):
        parts += [synthesize(voices[index % 4], text), silence]
    write_ogg(os.path.join(data, "long_multi_voice.ogg"), np.concatenate(parts))
    sample_dir = os.path.join(root, "ct2_flash", "data")
    os.makedirs(sample_dir, exist_ok=True)
    write_ogg(os.path.join(sample_dir, "sample.ogg"), synthesize("slt", SAMPLE_TEXT))


if __name__ == "__main__":
    main()
