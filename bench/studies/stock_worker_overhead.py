"""What the stock engine's channel costs per window: pipes, shared memory and JSON, apart from
the work the worker does.

For each real clip (one 30 s window each), the client encodes its features in the worker,
asks for greedy ``generate()`` there, and fetches the encoder output once (what a speculative
call adds). The worker reports how long each request took it; the rest of the round trip is
the channel's. Reported per window and as a share of the worker's encode.

    python bench/studies/stock_worker_overhead.py --out bench/results/stock_worker/overhead.json
"""

from __future__ import annotations

import argparse

from ct2_flash import FlashWhisperModel, resolve_model
from ct2_flash.benchmark.manifest import read_manifest
from ct2_flash.benchmark.runner import load_audio
from ct2_flash.benchmark.scripts import write_result
from ct2_flash.benchmark.speech_sets import fetch
from ct2_flash.stock.client import StockEngine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--speech-set", default="mfa")
    parser.add_argument("--limit", type=int, default=24)
    parser.add_argument("--compute-type", nargs="+", default=["int8", "float32"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    utterances = read_manifest(fetch(args.speech_set, ""))[: args.limit]
    audio = load_audio(utterances)
    path = resolve_model("tiny.en")
    results = {}
    for compute_type in args.compute_type:
        flash = FlashWhisperModel(
            path,
            stock_engine=False,
            compute_type=compute_type,
            cpu_threads=args.threads,
            decoder_threads=None,
            redecodes=False,
        )
        engine = StockEngine(path, flash.reference_model.compute_type, args.threads)
        try:
            windows = [flash.window_features(audio[u.path])[None] for u in utterances]
            encoding = engine.encode(windows[0])  # warm-up: the worker starts, kernels load
            engine.generate(encoding, [[50257]], {"beam_size": 1})
            engine.fetch(encoding)
            engine.timings.clear()
            for features in windows:
                encoding = engine.encode(features)
                engine.generate(encoding, [[50257]], {"beam_size": 1})
                engine.fetch(encoding)
        finally:
            engine.close()
        per_window = {
            op: {
                "round_trip_ms": 1e3 * trip / count,
                "worker_ms": 1e3 * inside / count,
                "channel_ms": 1e3 * (trip - inside) / count,
            }
            for op, (count, trip, inside) in engine.timings.items()
        }
        encode_ms = per_window["encode"]["worker_ms"]
        channel = per_window["encode"]["channel_ms"] + per_window["generate"]["channel_ms"]
        results[compute_type] = {
            "windows": len(windows),
            "per_window": per_window,
            "channel_ms_per_window": channel,
            "channel_share_of_encode": channel / encode_ms,
            "fetch_share_of_encode": per_window["fetch"]["round_trip_ms"] / encode_ms,
        }
        print(
            compute_type,
            {
                k: round(v, 4) if isinstance(v, float) else v
                for k, v in results[compute_type].items()
                if k != "per_window"
            },
            flush=True,
        )
    write_result(
        args.out,
        {
            "what": "the stock engine's channel per 30 s window: round trip minus the worker's own "
            "time (encode, greedy generate), and the fetch a speculative call adds",
            "model": "tiny.en",
            "threads": args.threads,
            "speech_set": args.speech_set,
            "results": results,
        },
    )


if __name__ == "__main__":
    main()
