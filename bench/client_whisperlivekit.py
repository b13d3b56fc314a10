"""A real streaming client on ct2-flash: whisperlivekit's LocalAgreement processor, replayed.

whisperlivekit (pinned: 0.2.26) streams through ``whisperlivekit.local_agreement``: its
``OnlineASRProcessor`` appends each chunk, transcribes the whole buffer with its
``FasterWhisperASR`` backend and commits what two hypotheses agree on. That backend builds its
own ``faster_whisper.WhisperModel`` in ``load_model`` and calls ``transcribe(...,
beam_size=5, word_timestamps=True, condition_on_previous_text=True)`` with the beam size
written into the call, so it cannot be redirected by options alone. It is driven here by a
subclass that changes exactly two things: ``load_model`` returns the model given
(``FlashWhisperModel`` or faster-whisper's own), and ``transcribe`` is the same call with
``beam_size=1`` (greedy; ct2-flash decodes only greedy and sampled calls speculatively) and,
by default, ``temperature=0`` (``--temperature client`` keeps faster-whisper's fallback list).
Everything else (the hypothesis buffer, the prompt, segment trimming at 15 s) is the client's.
The fallback's retries are random draws (several samples at temperatures above 0) whose
lengths, and so their times, differ from run to run and from system to system, enough to
decide a comparison of one run by chance (how much on the test clip: docs/measurements.md,
"whisperlivekit against tuned stock").

The file is fed ``--chunk`` seconds per iteration as fast as the machine runs (the client's
own pace is the same loop with waits), once per system, in turns over ``--repeats``:

- ``flash``: ``FlashWhisperModel`` (defaults: stock worker, re-decodes drafted);
- ``same``: faster-whisper on this environment's engine (the patched runtime);
- ``stock``: faster-whisper on stock ctranslate2, the same script in a child process with the
  stock engine first on its path (what users run today);
- ``tuned_stock``: the same with the allocator a user sets without code (tcmalloc preloaded
  where installed: ``stock/allocator.py``); each child reports the allocator its memory maps show.

Needs whisperlivekit's light path only (its full install pulls a web server and torchaudio):
``pip install --no-deps whisperlivekit==0.2.26 && pip install soundfile tiktoken numba`` (torch is
the ``[train]`` extra's). Writes JSON: per system the time of every iteration, and the
committed text, compared across systems.

    python bench/client_whisperlivekit.py tests/data/long_multi_voice.ogg --compute-type float32 \
        --out bench/results/redecodes/whisperlivekit.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

CLIENT = "whisperlivekit==0.2.26"
RATE = 16000
SYSTEMS = ("flash", "same", "stock", "tuned_stock")


def driven_asr(model, language: str, temperature=0.0):
    """whisperlivekit's faster-whisper backend on ``model``, greedy at ``temperature`` (a
    number, or faster-whisper's fallback list where None)."""
    from whisperlivekit.local_agreement.backends import FasterWhisperASR

    class Driven(FasterWhisperASR):
        def load_model(self, model_size=None, cache_dir=None, model_dir=None):
            return model

        def transcribe(self, audio, init_prompt=""):
            chosen = {} if temperature is None else {"temperature": temperature}
            segments, _ = self.model.transcribe(
                audio,
                language=self.original_language,
                initial_prompt=init_prompt,
                beam_size=1,
                word_timestamps=True,
                condition_on_previous_text=True,
                **chosen,
                **self.transcribe_kargs,
            )
            return list(segments)

    asr = Driven(language)
    # What whisperlivekit's core sets on a backend for the LocalAgreement policy (its defaults).
    asr.tokenizer, asr.confidence_validation = None, False
    asr.buffer_trimming, asr.buffer_trimming_sec = "segment", 15
    return asr


def stream(model, audio: np.ndarray, chunk_seconds: float, language: str, temperature=0.0) -> dict:
    """Replay ``audio`` through the client: seconds per iteration, and the committed words."""
    from whisperlivekit.local_agreement.online_asr import OnlineASRProcessor

    processor = OnlineASRProcessor(driven_asr(model, language, temperature))
    chunk = int(chunk_seconds * RATE)
    seconds, committed = [], []
    for start in range(0, audio.size, chunk):
        # Its own clock: the "stock" child runs on stock ctranslate2, where ct2_flash.benchmark.scripts (which
        # imports ct2_flash) cannot load.
        began = time.perf_counter()
        processor.insert_audio_chunk(audio[start : start + chunk])
        tokens, _ = processor.process_iter()
        seconds.append(time.perf_counter() - began)
        committed += [(round(t.start, 3), round(t.end, 3), t.text) for t in tokens]
    rest, _ = processor.finish()
    committed += [(round(t.start, 3), round(t.end, 3), t.text) for t in rest]
    return {"seconds": seconds, "committed": committed}


def child(args) -> None:
    """Runs one system in this process; prints its JSON (the stock system runs here)."""
    from faster_whisper import WhisperModel, decode_audio

    audio = decode_audio(args.audio)
    if args.system == "flash":
        from ct2_flash import FlashWhisperModel

        model = FlashWhisperModel(args.model_path, compute_type=args.compute_type, cpu_threads=args.threads)
    else:
        model = WhisperModel(args.model_path, compute_type=args.compute_type, cpu_threads=args.threads)
    import ctranslate2

    temperature = None if args.temperature == "client" else float(args.temperature)
    stream(model, audio[: 5 * RATE], args.chunk, args.language, temperature)  # warm-up
    if args.system == "flash":
        model.forget_windows()
        model.reset_spec_stats()
    runs = [stream(model, audio, args.chunk, args.language, temperature) for _ in range(args.repeats)]
    # loaded_allocator's check, written out: a stock child cannot import ct2_flash.
    with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
        allocator = "tcmalloc" if "libtcmalloc" in maps.read() else "glibc"
    result = {"system": args.system, "ctranslate2": ctranslate2.__version__, "runs": runs, "allocator": allocator}
    if args.system == "flash":
        stats = model.spec_stats
        result["loop"] = {**stats.redecode_counts(), "continued_rows": stats.continued_rows}
        model.model.engines.close()
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("audio")
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--compute-type", default="int8")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--chunk", type=float, default=1.0)
    parser.add_argument("--language", default="en")
    parser.add_argument(
        "--temperature",
        default="0",
        help="a number, or 'client' for faster-whisper's fallback list (sampled retries: random)",
    )
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1, help="turns of the four systems (each runs --repeats)")
    parser.add_argument("--out", default="")
    parser.add_argument("--system", default="", help=argparse.SUPPRESS)  # a child's system
    parser.add_argument("--model-path", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.system:
        child(args)
        return
    try:
        import whisperlivekit  # noqa: F401
    except ImportError:
        sys.exit(f"needs {CLIENT}: pip install --no-deps {CLIENT} && pip install soundfile tiktoken numba")
    from importlib.metadata import version

    from faster_whisper import decode_audio

    from ct2_flash import resolve_model
    from ct2_flash.benchmark.runner import machine
    from ct2_flash.benchmark.stock import stock_environment
    from ct2_flash.stock.allocator import tuned_allocator
    from ct2_flash.stock.location import environment_with

    path = resolve_model(args.model)
    audio_seconds = decode_audio(args.audio).size / RATE
    results: dict = {}
    for round_index in range(args.rounds):
        for system in SYSTEMS[round_index % len(SYSTEMS) :] + SYSTEMS[: round_index % len(SYSTEMS)]:
            environment = (
                stock_environment(tuned=system == "tuned_stock")
                if system in ("stock", "tuned_stock")
                else environment_with("")
            )
            command = [
                sys.executable,
                os.path.abspath(__file__),
                args.audio,
                "--system",
                system,
                "--model-path",
                path,
                "--compute-type",
                args.compute_type,
                "--threads",
                str(args.threads),
                "--chunk",
                str(args.chunk),
                "--language",
                args.language,
                "--repeats",
                str(args.repeats),
                "--temperature",
                args.temperature,
            ]
            done = subprocess.run(command, capture_output=True, text=True, env=environment)
            if done.returncode != 0:
                sys.exit(f"{system} failed:\n{done.stderr[-3000:]}")
            answer = json.loads(done.stdout.strip().splitlines()[-1])
            entry = results.setdefault(
                system, {"ctranslate2": answer["ctranslate2"], "allocator": answer["allocator"], "runs": [], "loop": []}
            )
            entry["runs"] += answer["runs"]
            if "loop" in answer:
                entry["loop"].append(answer["loop"])
    summary = {}
    for system, entry in results.items():
        per_iteration = [s for run in entry["runs"] for s in run["seconds"]]
        summary[system] = {
            "mean_iteration_seconds": statistics.mean(per_iteration),
            "p95_iteration_seconds": float(np.percentile(per_iteration, 95)),
            "total_seconds_per_run": statistics.median(sum(run["seconds"]) for run in entry["runs"]),
        }
    committed = {system: [run["committed"] for run in entry["runs"]] for system, entry in results.items()}
    document = {
        "what": f"{CLIENT} LocalAgreement processor (beam_size=1) replaying a file, per system",
        "client": CLIENT,
        "client_version": version("whisperlivekit"),
        "audio": args.audio,
        "audio_seconds": audio_seconds,
        "model": args.model,
        "compute_type": args.compute_type,
        "chunk_seconds": args.chunk,
        "temperature": args.temperature,
        "machine": machine(),
        "summary": summary,
        "speedup_vs_same": summary["same"]["total_seconds_per_run"] / summary["flash"]["total_seconds_per_run"],
        "speedup_vs_stock": summary["stock"]["total_seconds_per_run"] / summary["flash"]["total_seconds_per_run"],
        "speedup_vs_tuned_stock": summary["tuned_stock"]["total_seconds_per_run"]
        / summary["flash"]["total_seconds_per_run"],
        "tuned_allocator": tuned_allocator().describe(),
        "committed_identical": {
            f"flash_vs_{other}": all(run == committed["flash"][0] for run in committed[other] + committed["flash"])
            for other in ("same", "stock", "tuned_stock")
        },
        "committed_text": "".join(word for _, _, word in committed["flash"][0]).strip(),
        "systems": results,
    }
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as out:
            json.dump(document, out, indent=2)
    print(
        json.dumps(
            {
                key: document[key]
                for key in (
                    "summary",
                    "speedup_vs_same",
                    "speedup_vs_stock",
                    "speedup_vs_tuned_stock",
                    "committed_identical",
                )
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
