"""Transcribing files, not waveforms: what reading the audio costs each system.

``ct2-flash bench`` reads every file once and times waveform to text. Users mostly pass a
path, and faster-whisper's ``decode_audio`` ends with a full garbage collection, whose cost
grows with every object the process holds; ct2-flash reads files the same way but lets that
collection examine only the objects made while reading (``audio.young_collections``). This
script times, on the same files and interleaved:

- reading alone: faster-whisper's ``decode_audio(path)`` against ct2-flash's ``checked_audio(path)``
  (the same samples, checked);
- the whole path from a file: ``transcribe(path)`` with faster-whisper's ``WhisperModel`` and
  ``FlashWhisperModel`` (tiny.en, ``beam_size=1``, the default drafter and policy), tokens
  compared.

Both models live in one process, so both collections walk the same objects. Writes JSON.

    python bench/studies/file_input.py --out bench/results/file_input/int8.json
"""

from __future__ import annotations

import argparse
import gc
import glob
import json
import os
import statistics

from ct2_flash.benchmark.scripts import interleaved, machine, timed, write_result

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--audio",
        nargs="*",
        default=sorted(glob.glob(os.path.join(ROOT, "tests", "data", "clip*.ogg"))),
        help="audio files (default: the committed test clips)",
    )
    parser.add_argument("--compute-type", default="int8")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "file_input", "int8.json"))
    args = parser.parse_args()

    from faster_whisper import WhisperModel, decode_audio

    from ct2_flash import FlashWhisperModel
    from ct2_flash.adapter.audio import checked_audio
    from ct2_flash.benchmark.analysis import paired_bootstrap
    from ct2_flash.benchmark.measure import measure
    from ct2_flash.engine.models import resolve_model

    path = resolve_model("tiny.en")
    options = dict(compute_type=args.compute_type, cpu_threads=args.threads)
    baseline, flash = (
        WhisperModel(path, **options),
        FlashWhisperModel(path, stock_engine=False, **options, redecodes=False),
    )
    transcribe = dict(beam_size=1)
    measure(baseline, args.audio[0], **transcribe)  # warm-up
    measure(flash, args.audio[0], **transcribe)
    gc.collect()
    objects = len(gc.get_objects())

    rows = []
    for audio in args.audio:
        calls = interleaved(
            {  # so load drift hits both alike
                "read_faster_whisper": lambda audio=audio: timed(lambda: decode_audio(audio, sampling_rate=16000))[0],
                "read_ct2_flash": lambda audio=audio: timed(lambda: checked_audio(audio, 16000))[0],
                "faster_whisper": lambda audio=audio: measure(baseline, audio, **transcribe),
                "ct2_flash": lambda audio=audio: measure(flash, audio, **transcribe),
            },
            args.repeats,
            warmup=0,
        )
        identical = all(base.tokens == got.tokens for base, got in zip(calls["faster_whisper"], calls["ct2_flash"]))
        runs = {
            "read_faster_whisper": calls["read_faster_whisper"],
            "read_ct2_flash": calls["read_ct2_flash"],
            "whole_faster_whisper": [m.whole_seconds for m in calls["faster_whisper"]],
            "whole_ct2_flash": [m.whole_seconds for m in calls["ct2_flash"]],
        }
        rows.append(
            {
                "audio": os.path.relpath(audio, ROOT),
                "identical": identical,
                **{name: statistics.median(times) for name, times in runs.items()},
            }
        )
        print(
            f"{os.path.basename(audio)}: read {rows[-1]['read_faster_whisper'] * 1e3:.0f} -> "
            f"{rows[-1]['read_ct2_flash'] * 1e3:.0f} ms, whole {rows[-1]['whole_faster_whisper']:.2f} -> "
            f"{rows[-1]['whole_ct2_flash']:.2f} s, identical {identical}"
        )

    def column(name):
        return [row[name] for row in rows]

    document = {
        "what": "reading audio files and transcribing from a path: faster-whisper vs ct2-flash (medians per file)",
        "compute_type": args.compute_type,
        "threads": args.threads,
        "repeats": args.repeats,
        "objects_tracked_by_gc": objects,
        "machine": machine(),
        "summary": {
            "files": len(rows),
            "identical": sum(row["identical"] for row in rows),
            "read_ms_median": {
                "faster_whisper": 1e3 * statistics.median(column("read_faster_whisper")),
                "ct2_flash": 1e3 * statistics.median(column("read_ct2_flash")),
            },
            "whole_from_file_vs_faster_whisper": paired_bootstrap(
                column("whole_faster_whisper"), column("whole_ct2_flash")
            ),
        },
        "files": rows,
    }
    write_result(args.out, document)
    print(json.dumps(document["summary"], indent=2))


if __name__ == "__main__":
    main()
