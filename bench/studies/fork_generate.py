"""Whether greedy ``generate()`` may run on either engine: the patched runtime's decoder on a
copy of the stock worker's encoder output against the worker's own, on real speech.

For every clip and compute type, ``FlashWhisperModel(stock_engine=True)`` transcribes twice
(greedy, timestamps on, the loop off, ``temperature=0``: no sampled fallback, whose draws
would differ between any two runs), once with every ``generate()`` call in the worker and
once with every call on the patched runtime (``FixedEngine``, the model's ``engine_router``), in alternating order;
the encoder runs in the worker both times. Reported: clips whose tokens are identical, and the
summed time of the greedy calls on each engine (the worker's includes its channel, the patched
runtime's the copy of the encoding), from the same run.

    python bench/studies/fork_generate.py --out bench/results/stock_engine/fork_generate.json
"""

from __future__ import annotations

import argparse
import glob
import os

from faster_whisper import decode_audio

from ct2_flash import FlashWhisperModel, resolve_model
from ct2_flash.adapter.routing import CallRouter, EngineRouter
from ct2_flash.benchmark.manifest import read_manifest
from ct2_flash.benchmark.runner import load_audio
from ct2_flash.benchmark.scripts import TEST_CLIPS, write_result
from ct2_flash.benchmark.speech_sets import fetch


class NeverSpeculate(CallRouter):
    def use_loop(self, batch_size: int) -> bool:
        return False


class FixedEngine(EngineRouter):
    """Every greedy call on the engine ``use`` names; sums what each engine measured."""

    def __init__(self) -> None:
        super().__init__()
        self.engine = "stock"
        self.clear()

    def clear(self) -> None:
        self.seconds = {"stock": 0.0, "patched": 0.0}
        self.tokens = {"stock": 0, "patched": 0}
        self.calls = {"stock": 0, "patched": 0}

    def use(self, engine: str) -> None:
        self.engine = engine

    def use_patched(self, batch_size: int) -> bool:
        return self.engine == "patched"

    def record(self, patched: bool, batch_size: int, seconds: float, tokens: int) -> None:
        name = "patched" if patched else "stock"
        assert name == self.engine
        self.seconds[name] += seconds
        self.tokens[name] += tokens
        self.calls[name] += 1


def sets(names):
    """set name -> {clip name: waveform}: the real sets and the committed test clips."""
    audio = {}
    for name in names:
        utterances = read_manifest(fetch(name, ""))
        waveforms = load_audio(utterances)
        audio[name] = {u.path: waveforms[u.path] for u in utterances}
    audio["test clips"] = {
        os.path.basename(p): decode_audio(p) for p in sorted(glob.glob(os.path.join(TEST_CLIPS, "*.ogg")))
    }
    return audio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--speech-set", nargs="+", default=["mfa", "pocketsphinx"])
    parser.add_argument("--compute-type", nargs="+", default=["float32", "int8"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--limit", type=int, default=0, help="clips per set (0: all)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    audio = sets(args.speech_set)
    path = resolve_model("tiny.en")
    results = {}
    for compute_type in args.compute_type:
        engine = FixedEngine()
        model = FlashWhisperModel(
            path,
            compute_type=compute_type,
            cpu_threads=args.threads,
            stock_engine=True,
            call_router=NeverSpeculate(),
            engine_router=engine,
            redecodes=False,
        )
        list(model.transcribe(next(iter(audio["test clips"].values())), beam_size=1)[0])  # warm-up: worker starts
        engine.clear()
        per_set = {}
        order = 0
        for set_name, clips in audio.items():
            differing = []
            for clip, waveform in list(clips.items())[: args.limit or None]:
                tokens = {}
                names = ["stock", "patched"] if order % 2 == 0 else ["patched", "stock"]
                order += 1
                for name in names:
                    engine.use(name)
                    segments, _ = model.transcribe(waveform, beam_size=1, temperature=0.0)
                    tokens[name] = [list(s.tokens) for s in segments]
                if tokens["stock"] != tokens["patched"]:
                    differing.append(clip)
            count = min(len(clips), args.limit or len(clips))
            per_set[set_name] = {"clips": count, "identical": count - len(differing), "differing": differing}
            print(compute_type, set_name, per_set[set_name], flush=True)
        assert model.model.engines.stock_failures == 0
        results[compute_type] = {
            "sets": per_set,
            "generate_seconds": engine.seconds,
            "generate_calls": engine.calls,
            "tokens": engine.tokens,
            "patched_over_stock_time": engine.seconds["patched"] / engine.seconds["stock"],
        }
        model.model.engines.close()
    write_result(
        args.out,
        {
            "command": "python bench/studies/fork_generate.py "
            + " ".join(
                f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
                for k, v in vars(args).items()
            ),
            "threads": args.threads,
            "results": results,
        },
        echo=["results"],
    )


if __name__ == "__main__":
    main()
