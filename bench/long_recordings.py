"""Long recordings for the long-form benchmark: the 69 real clips of the ``mfa`` speech set
joined in their manifest's order, 0.5 s of silence after each, into two recordings of about
3.8 minutes (full 30 s windows, ``condition_on_previous_text`` carrying text between them).

    python bench/long_recordings.py   # writes ~/.cache/ct2_flash/long_form/mfa_long_{0,1}.wav
    ct2-flash bench --audio-dir ~/.cache/ct2_flash/long_form --compute-types int8 float32 --repeats 2 --stock
"""

from __future__ import annotations

import argparse
import os
import wave

import numpy as np

RATE = 16000


def main() -> None:
    from faster_whisper import decode_audio

    from ct2_flash.benchmark.manifest import read_manifest
    from ct2_flash.benchmark.speech_sets import fetch

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--speech-set", default="mfa")
    parser.add_argument("--parts", type=int, default=2)
    parser.add_argument("--out", default=os.path.join(os.path.expanduser("~"), ".cache", "ct2_flash", "long_form"))
    args = parser.parse_args()

    clips = [decode_audio(utterance.path) for utterance in read_manifest(fetch(args.speech_set))]
    silence = np.zeros(RATE // 2, np.float32)
    share = sum(clip.size for clip in clips) / args.parts
    recordings, current, length = [], [], 0
    for clip in clips:
        current += [clip, silence]
        length += clip.size
        if length >= share and len(recordings) < args.parts - 1:
            recordings.append(np.concatenate(current))
            current, length = [], 0
    recordings.append(np.concatenate(current))
    os.makedirs(args.out, exist_ok=True)
    for index, samples in enumerate(recordings):
        path = os.path.join(args.out, f"{args.speech_set}_long_{index}.wav")
        with wave.open(path, "wb") as stream:
            stream.setnchannels(1)
            stream.setsampwidth(2)
            stream.setframerate(RATE)
            stream.writeframes((np.clip(samples, -1.0, 1.0) * 32767).astype(np.int16).tobytes())
        print(f"{path}: {samples.size / RATE:.1f} s")


if __name__ == "__main__":
    main()
