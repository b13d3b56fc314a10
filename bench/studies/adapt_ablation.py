"""``ct2-flash adapt`` ablation at one budget: what is trained, the audio window, more audio.

Every variant adapts the shipped drafter on the same training files of one speech set (the
same split by file as ``adapt_domains.py``: same files, same hash) with the same number of
updates, and is judged on the same held-out recordings in the real cached loop with every
round drafting (the adaptation's own held-out validation, the start scored first):

- ``all``: every drafter weight, the runtime's audio window (the default);
- ``last-layer``: only the last block and the final norm;
- ``all-audio``: blocks read all of the audio in training instead of the runtime's window;
- ``speed-copies``: each training window also labelled at two other speeds (0.9-1.1x);
- ``lr-3e-4``: three times the default peak learning rate;
- ``bf16``: training's forward pass under bfloat16 autocast.

    python bench/studies/adapt_ablation.py --domain mfa --out bench/results/adapt/ablation.json
"""

from __future__ import annotations

import argparse
import os
import sys

from ct2_flash.benchmark.scripts import save_figure, write_result

VARIANTS = {
    "all": {},
    "last-layer": {"trained": "last-layer"},
    "all-audio": {"audio_window": False},
    "speed-copies": {"speed_copies": 2},
    "lr-3e-4": {"learning_rate": 3e-4},
    "bf16": {"bf16": True},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--domain", default="mfa")
    parser.add_argument("--holdout", type=float, default=0.5)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--work", default=os.path.join(os.path.expanduser("~"), ".cache", "ct2_flash", "adapt"))
    parser.add_argument("--out", default="bench/results/adapt/ablation.json")
    args = parser.parse_args()
    import json

    from ct2_flash.benchmark.manifest import read_manifest
    from ct2_flash.benchmark.speech_sets import fetch
    from ct2_flash.train.adapt import REPORT_FILE, AdaptOptions, adapt, work_dir_for

    files = [u.path for u in read_manifest(fetch(args.domain))]
    results = {}
    for name in args.variants:
        # The default variant is the one adapt_domains.py made, when it is there.
        out = os.path.join(args.work, f"{args.domain}_float32" if name == "all" else f"{args.domain}_float32_{name}")
        if not os.path.isdir(out):
            adapt(
                files,
                out,
                AdaptOptions(holdout=args.holdout, **VARIANTS[name]),
                resume=os.path.isdir(work_dir_for(out)),
            )
        with open(os.path.join(out, REPORT_FILE), encoding="utf-8") as stream:
            report = json.load(stream)
        results[name] = {
            "options": VARIANTS[name],
            "every_round": report["held_out"]["every_round"],
            "best_step": report["training"]["best_step"],
            "steps": report["training"]["steps"],
            "seconds": report["seconds"],
            "curve": report["curve"],
        }
        print(name, json.dumps(results[name]["every_round"]["adapted"]), flush=True)
    document = {"domain": args.domain, "holdout": args.holdout, "command": " ".join(sys.argv), "variants": results}
    write_result(args.out, document)
    plot(document, os.path.splitext(args.out)[0] + ".png")


def plot(document: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 3.5))
    for name, result in document["variants"].items():
        axis.plot(
            [p["step"] for p in result["curve"]],
            [p["tokens_per_call"] for p in result["curve"]],
            marker="o",
            markersize=3,
            label=name,
        )
    axis.set(
        xlabel="update",
        ylabel="tokens per target call",
        title=f"held-out {document['domain']} recordings, every round drafting",
    )
    axis.legend(fontsize=7)
    save_figure(figure, path)


if __name__ == "__main__":
    main()
