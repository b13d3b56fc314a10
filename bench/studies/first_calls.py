"""The first call of a new model: what a process that transcribes one file gets.

The policy learns which way is cheaper from the calls it serves, so a process that makes only
a few calls (a command-line run, a serverless function) is decided by where the policy starts.
For each file this script builds new models and times one transcription with each:
faster-whisper's ``WhisperModel``, the default ``FlashWhisperModel`` (``generate()`` first, the
loop measured at the first probe), and the same with the previous start (the loop measured on
the first call), on the same engine, tiny.en, ``beam_size=1``, timestamps on. Model loading is
not timed. Writes JSON.

    python bench/studies/first_calls.py --speech-set mfa --limit 16 --out bench/results/first_calls/int8.json
"""

from __future__ import annotations

import argparse
import json
import os

from ct2_flash.benchmark.scripts import machine, write_result

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--speech-set", default="mfa", help="a speech set of `ct2-flash bench` (fetched once)")
    parser.add_argument("--limit", type=int, default=16)
    parser.add_argument("--compute-type", default="int8")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "first_calls", "int8.json"))
    args = parser.parse_args()

    from faster_whisper import WhisperModel, decode_audio

    from ct2_flash import FlashWhisperModel
    from ct2_flash.adapter.routing import CallRouter
    from ct2_flash.benchmark.analysis import paired_bootstrap
    from ct2_flash.benchmark.manifest import read_manifest
    from ct2_flash.benchmark.measure import measure
    from ct2_flash.benchmark.speech_sets import fetch
    from ct2_flash.engine.models import resolve_model

    class LoopFirst(CallRouter):
        """The previous start: the loop's first measurement on the first call."""

        def use_loop(self, batch_size: int) -> bool:
            return True if self.speculative_cost is None else super().use_loop(batch_size)

    path = resolve_model("tiny.en")
    options = dict(compute_type=args.compute_type, cpu_threads=args.threads)
    utterances = read_manifest(fetch(args.speech_set, ""))[: args.limit]

    def flash_with(policy):
        return FlashWhisperModel(path, call_router=policy, **options, redecodes=False)

    systems = {
        "faster-whisper": lambda: WhisperModel(path, **options),
        "ct2-flash": lambda: flash_with(None),
        "ct2-flash, loop first": lambda: flash_with(LoopFirst()),
    }
    rows = []
    for index, utterance in enumerate(utterances):
        audio = decode_audio(utterance.path)
        names = list(systems)
        names = names[index % 3 :] + names[: index % 3]  # each system first in turn
        row = {"audio": os.path.basename(utterance.path), "seconds": audio.size / 16000}
        tokens = {}
        for name in names:
            model = systems[name]()
            result = measure(model, audio, beam_size=1)
            row[name] = {"decode": result.decode_seconds, "whole": result.whole_seconds}
            if name != "faster-whisper":
                row[name]["speculative_calls"] = model.spec_stats.rows_in_loop
            tokens[name] = result.tokens
            del model
        row["identical"] = all(tokens[name] == tokens["faster-whisper"] for name in tokens)
        rows.append(row)
        print(f"{row['audio']}: " + ", ".join(f"{name} decode {row[name]['decode']:.3f} s" for name in systems))

    summary = {}
    for name in ("ct2-flash", "ct2-flash, loop first"):
        summary[name] = {
            part: paired_bootstrap([row["faster-whisper"][part] for row in rows], [row[name][part] for row in rows])
            for part in ("decode", "whole")
        }
        summary[name]["speculative_calls"] = sum(row[name]["speculative_calls"] for row in rows)
    document = {
        "what": "one transcription per new model, against faster-whisper on the same engine (speedup = faster-whisper / system)",
        "speech_set": args.speech_set,
        "compute_type": args.compute_type,
        "threads": args.threads,
        "machine": machine(),
        "identical": sum(row["identical"] for row in rows),
        "files": len(rows),
        "summary": summary,
        "files_measured": rows,
    }
    write_result(args.out, document)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
