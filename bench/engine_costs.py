"""What a target call costs the loop against a token of CTranslate2's own ``generate()``, and
from it the tokens per target call at which the loop breaks even.

On one 30 s window of real speech, per compute type and thread count, each in a child process
of its own (so that one setting's OpenMP workers and allocations do not slow the next):

- ``generate()`` per token: the slope of greedy ``generate()`` between two lengths of the
  same transcript (its first step, which reads the whole encoder output, cancels out), on the
  patched engine, on stock ctranslate2, and on stock with the tuned allocator;
- the patched engine driven from Python as the loop drives it: ``prefill``, one
  ``forward_step`` and ``forward_batch`` of T rows (a verification of T - 1 drafts) per call,
  teacher-forced on the transcript's own tokens, at cache lengths spread over the window.

``break_even_tokens`` is a T-row call's cost in ``generate()`` tokens: a round must emit at
least that many tokens (accepted drafts plus the target's own) to cost no more than
``generate()``, before any drafter time. Nothing is timed while anything else runs.

    python bench/engine_costs.py --out bench/results/engine_costs/engine_costs.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Dict, List

# The child runs stock ctranslate2 where it is first on the path: it imports nothing from
# ct2_flash (whose import checks for the patched runtime), so ct2_flash.benchmark.scripts is imported in main().
TEST_CLIPS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data")
ROWS = (1, 2, 4, 9, 17, 33)
LENGTHS = (10, 70)  # tokens of two generate() calls whose difference gives the per-token slope


def _window(path: str):
    """[1, 80, 3000] float32 features of the first 30 s of ``path``."""
    import numpy as np
    from faster_whisper import decode_audio
    from faster_whisper.feature_extractor import FeatureExtractor

    audio = decode_audio(path)[: 16000 * 30]
    return np.ascontiguousarray(FeatureExtractor(80)(audio)[:, :3000][None], dtype=np.float32)


def measure_child(model_path: str, audio: str, compute_type: str, threads: int, repeats: int, driven: bool) -> dict:
    """Runs in the child: this interpreter's ctranslate2 (stock or patched) on one window."""
    import ctranslate2

    model = ctranslate2.models.Whisper(model_path, device="cpu", compute_type=compute_type, intra_threads=threads)
    encoded = model.encode(ctranslate2.StorageView.from_array(_window(audio)))
    prompt = [50257]
    transcript = model.generate(encoded, [prompt], beam_size=1, max_length=448)[0].sequences_ids[0]
    if len(transcript) < max(LENGTHS) + max(ROWS):
        raise SystemExit(f"{audio}: a transcript of {len(transcript)} tokens is too short for these lengths")

    def generate_ms(tokens: int) -> float:
        # Greedy generate() runs at most max_length // 2 steps (PromptLayout.max_steps): twice
        # the tokens wanted, so that the call makes exactly ``tokens`` of them.
        started = time.perf_counter()
        made = model.generate(encoded, [prompt], beam_size=1, max_length=2 * tokens)[0].sequences_ids[0]
        elapsed = 1000 * (time.perf_counter() - started)
        if len(made) != tokens:
            raise SystemExit(f"generate() made {len(made)} tokens where {tokens} were asked")
        return elapsed

    result: Dict[str, object] = {"ctranslate2": ctranslate2.__version__}
    times: Dict[int, List[float]] = {length: [] for length in LENGTHS}
    for _ in range(repeats):  # the two lengths in turn: drift hits both
        for length in LENGTHS:
            times[length].append(generate_ms(length))
    short, long = (statistics.median(times[length]) for length in LENGTHS)
    result["generate_token_ms"] = (long - short) / (LENGTHS[1] - LENGTHS[0])
    result["generate_first_steps_ms"] = short
    if not driven:
        return result

    def prefill():
        return model.prefill(encoded, prompt)[0]

    prefill_ms = []
    calls: Dict[int, List[float]] = {rows: [] for rows in ROWS}
    for _ in range(repeats):
        started = time.perf_counter()
        state = prefill()
        prefill_ms.append(1000 * (time.perf_counter() - started))
        position = 0
        # One call of each size in turn, teacher-forced, the cache growing over the window.
        while position + sum(ROWS) <= min(len(transcript), max(LENGTHS) + max(ROWS)):
            for rows in ROWS:
                tokens = transcript[position : position + rows]
                started = time.perf_counter()
                if rows == 1:
                    model.forward_step(state, tokens[0])
                else:
                    model.forward_batch(state, tokens)
                calls[rows].append(1000 * (time.perf_counter() - started))
                position += rows
    result["prefill_ms"] = statistics.median(prefill_ms)
    result["call_ms"] = {str(rows): statistics.median(calls[rows]) for rows in ROWS}
    token = result["generate_token_ms"]
    result["break_even_tokens"] = {str(rows): statistics.median(calls[rows]) / token for rows in ROWS}
    return result


def run_child(engine: str, args: argparse.Namespace, compute_type: str, threads: int) -> dict:
    """One setting in a child process: ``engine`` "patched", "stock" or "tuned_stock"."""
    from ct2_flash.engine.models import resolve_model
    from ct2_flash.stock.allocator import GLIBC_DEFAULT, tuned_allocator
    from ct2_flash.stock.location import environment_with, installed, stock_dir

    environment = dict(os.environ)
    allocator = GLIBC_DEFAULT
    if engine != "patched":
        if not installed():
            raise SystemExit(f"stock ctranslate2 is not installed in {stock_dir()} (python -m ct2_flash.stock)")
        environment = environment_with(stock_dir())
        allocator = tuned_allocator() if engine == "tuned_stock" else GLIBC_DEFAULT
    command = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        json.dumps(
            {
                "model_path": resolve_model(args.model),
                "audio": args.audio,
                "compute_type": compute_type,
                "threads": threads,
                "repeats": args.repeats,
                "driven": engine == "patched",
            }
        ),
    ]
    done = subprocess.run(command, env=allocator.environment(environment), capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{engine} {compute_type} {threads}: {done.stderr.strip()}")
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "allocator": allocator.describe()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument(
        "--audio",
        default=os.path.join(TEST_CLIPS, "long_multi_voice.ogg"),
        help="a recording of at least 30 s of speech (its first window is used)",
    )
    parser.add_argument("--compute-types", nargs="+", default=["float32", "int8"])
    parser.add_argument("--threads", nargs="+", type=int, default=[2, 1])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", default="bench/results/engine_costs/engine_costs.json")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure_child(**json.loads(args.child))))
        return
    from ct2_flash.benchmark.scripts import write_result

    settings = []
    for compute_type in args.compute_types:
        for threads in args.threads:
            engines = {
                engine: run_child(engine, args, compute_type, threads) for engine in ("patched", "stock", "tuned_stock")
            }
            settings.append({"compute_type": compute_type, "threads": threads, **engines})
            patched = engines["patched"]
            print(
                f"{compute_type}, {threads} thread(s): generate() per token patched {patched['generate_token_ms']:.2f} ms, "
                f"stock {engines['stock']['generate_token_ms']:.2f}, tuned stock {engines['tuned_stock']['generate_token_ms']:.2f}; "
                f"Python-driven calls "
                + ", ".join(
                    f"T={rows} {patched['call_ms'][str(rows)]:.2f} ms "
                    f"({patched['break_even_tokens'][str(rows)]:.1f} tokens)"
                    for rows in ROWS
                )
            )
    write_result(
        args.out,
        {
            "what": "one target call driven from Python (forward_step, forward_batch of T rows) against a token of "
            "generate(), per engine; break_even_tokens = call / generate() token",
            "command": "python bench/engine_costs.py " + " ".join(sys.argv[1:]),
            "audio": os.path.relpath(args.audio),
            "settings": settings,
        },
    )


if __name__ == "__main__":
    main()
