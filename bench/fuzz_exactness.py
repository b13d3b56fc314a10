"""The long fuzz: random transcribe() options and drafters against faster-whisper, float32, on
every committed clip (``ct2_flash/validation/fuzzing.py``; ``tests/test_fuzz.py`` runs a bounded part).

Resumable: each case is appended to ``--log`` (JSON lines; by default beside ``--out``, so the
per-case records are committed with the summary) as it finishes and skipped when the script
runs again, so a run can be split over sessions. ``--shard K/N`` runs every N-th case from the
K-th (one process per core; the shards share the log). The summary (cases, identical, how many
were speculative, which fell back) goes to ``--out`` once every case is in the log.

    python bench/fuzz_exactness.py --cases 2000 --out bench/results/fuzz/fuzz.json
    python bench/fuzz_exactness.py --cases 2000 --threads 1 --shard 0/2 --out bench/results/fuzz/fuzz.json &
    python bench/fuzz_exactness.py --cases 2000 --threads 1 --shard 1/2 --out bench/results/fuzz/fuzz.json
    python bench/fuzz_exactness.py --model base --cases 300 --out bench/results/fuzz/fuzz_base.json

On the multilingual base the cases also draw the language (or detection), the task and
prompts in other languages.
"""

from __future__ import annotations

import argparse
import json
import os
from collections import Counter

from ct2_flash.benchmark.scripts import write_result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny.en", help="tiny.en or base (multilingual)")
    parser.add_argument("--cases", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--log", help="per-case JSON lines (default: beside --out, <name>.cases.jsonl)")
    parser.add_argument("--shard", default="0/1", help="K/N: run the cases whose index is K modulo N")
    parser.add_argument(
        "--from-end",
        action="store_true",
        help="take the shard's cases last first: a second process on a shard that is behind "
        "meets the first halfway and stops there",
    )
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    shard, shards = (int(part) for part in args.shard.split("/"))
    if not 0 <= shard < shards:
        parser.error(f"--shard {args.shard}: K must be in 0..N-1")
    log_path = args.log or os.path.splitext(args.out)[0] + ".cases.jsonl"

    import glob

    import numpy as np
    from faster_whisper import WhisperModel, decode_audio
    from tqdm import tqdm

    from ct2_flash import FlashWhisperModel, resolve_model
    from ct2_flash.drafting.reference import OracleDrafter, RandomDrafter
    from ct2_flash.validation.fuzzing import random_case, run_case

    data = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data")
    audio = {os.path.basename(p): decode_audio(p) for p in sorted(glob.glob(os.path.join(data, "*.ogg")))}
    path = resolve_model(args.model)
    baseline = WhisperModel(path, compute_type="float32", cpu_threads=args.threads)
    flash = FlashWhisperModel(
        args.model, stock_engine=False, compute_type="float32", cpu_threads=args.threads, redecodes=False
    )
    multilingual = flash.model.is_multilingual
    drafters = {
        "shipped": flash.decoder.drafter,
        "oracle": OracleDrafter(flash.reference_model, error_rate=0.25, seed=1),
        "random": RandomDrafter(flash.decoder.runtime.special.vocab_size, seed=2),
    }

    def finished() -> dict:
        """index -> record of the cases of this seed and model already in the log."""
        records = {}
        if os.path.exists(log_path):
            with open(log_path, encoding="utf-8") as stream:
                for line in stream:
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError:  # a line cut by a kill: that case runs again
                        continue
                    if record.get("seed") == args.seed and record.get("model", "tiny.en") == args.model:
                        records[record["index"]] = record
        return records

    done = finished()
    rng = np.random.default_rng(args.seed)
    cases = [
        random_case(rng, sorted(audio), multilingual) for _ in range(args.cases)
    ]  # drawn in full: resumes repeat them
    mine = [index for index in range(shard, len(cases), shards) if index not in done]
    if args.from_end:
        mine.reverse()
    os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
    # One write per line in append mode: the shards' lines never interleave.
    with open(log_path, "a", encoding="utf-8") as log:
        for index in tqdm(mine, desc=f"fuzz {args.shard}"):
            if args.from_end and index in finished():  # the other process got here first
                break
            result = run_case(cases[index], flash, baseline, audio, drafters)
            log.write(json.dumps({"index": index, "seed": args.seed, "model": args.model, **result}) + "\n")
            log.flush()
    done = finished()
    missing = [index for index in range(len(cases)) if index not in done]
    if missing:
        print(f"{len(cases) - len(missing)}/{len(cases)} cases in {log_path}; the summary waits for the rest")
        return
    records = [done[i] for i in range(len(cases))]
    options = Counter(name for record in records for name in record["options"])
    summary = {
        "what": "fuzzed exactness at float32: random transcribe() options and drafters vs faster-whisper",
        "model": args.model,
        "seed": args.seed,
        "cases": len(records),
        "identical": sum(r["identical"] for r in records),
        "speculative_cases": sum(r["speculative_rows"] > 0 for r in records),
        "fallback_cases": sum(r["fallback_calls"] > 0 for r in records),
        "by_drafter": dict(Counter(r["drafter"] for r in records)),
        "options_drawn": dict(options),
        "differing": [r for r in records if not r["identical"]],
    }
    write_result(args.out, summary)
    print(
        f"{summary['identical']}/{summary['cases']} identical; {summary['speculative_cases']} speculative, "
        f"{summary['fallback_cases']} left to CTranslate2"
    )


if __name__ == "__main__":
    main()
