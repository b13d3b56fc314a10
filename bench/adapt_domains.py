"""``ct2-flash adapt`` on one real domain, measured on its held-out half and on other domains.

Adapts the shipped drafter on part of a speech set's recordings (split by file, the rest held
out), then runs ``ct2-flash bench`` with the shipped and with the adapted drafter on

- the held-out recordings of that domain (``held_out``),
- another speech set (``other``: mfa for pocketsphinx, pocketsphinx for the others),
- the committed test clips (``test_clips``: synthetic voices, a third domain),

each as the defaults run it (``FlashWhisperModel`` against faster-whisper on the same engine
and on stock ctranslate2) and with every round drafting (``--draft-every-round``, at int8 with
``--near-exact``: what the network itself reaches). Each bench run compares the systems in one interleaved run; the
shipped and adapted drafters are two runs on the same audio. The adaptation's own report
(held-out curve, time per stage) is copied next to the results.

    python bench/adapt_domains.py --domain mfa --holdout 0.5 --compute-type float32 \
        --out bench/results/adapt

The adapted drafter and the work directory stay in ``--work`` (default
``~/.cache/ct2_flash/adapt``): rerunning resumes or reuses them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from typing import Dict, List

from ct2_flash.benchmark.scripts import TEST_CLIPS, save_figure, write_result

OTHER = {"mfa": "pocketsphinx", "pocketsphinx": "mfa", "asterisk": "pocketsphinx"}


def adapt_domain(domain: str, holdout: float, compute_type: str, work: str, minutes: float) -> str:
    """Adapt on the domain's training files (once); returns the drafter directory."""
    from ct2_flash.benchmark.manifest import read_manifest
    from ct2_flash.benchmark.speech_sets import fetch
    from ct2_flash.train.adapt import AdaptOptions, adapt, work_dir_for

    out = os.path.join(work, f"{domain}_{compute_type}")
    if not os.path.isdir(out):
        files = [u.path for u in read_manifest(fetch(domain))]
        options = AdaptOptions(compute_type=compute_type, holdout=holdout, minutes=minutes)
        adapt(files, out, options, resume=os.path.isdir(work_dir_for(out)))
    return out


def held_out_manifest(domain: str, drafter: str, path: str) -> str:
    """The domain's held-out recordings (from the adaptation's plan), with their references."""
    from ct2_flash.benchmark.manifest import read_manifest, write_manifest
    from ct2_flash.benchmark.speech_sets import fetch
    from ct2_flash.train.adapt import PLAN_FILE, work_dir_for

    with open(os.path.join(work_dir_for(drafter), PLAN_FILE), encoding="utf-8") as stream:
        plan = json.load(stream)
    held = {p for p, split in plan["files"].items() if split == "validation"}
    write_manifest(path, [u for u in read_manifest(fetch(domain)) if u.path in held])
    return path


def bench(inputs: List[str], drafter: str, compute_type: str, repeats: int, every_round: bool, out: str) -> dict:
    """One ``ct2-flash bench`` run (or the one already in ``out``: delete it to measure again);
    returns its summary."""
    command = [
        sys.executable,
        "-m",
        "ct2_flash.cli",
        "bench",
        *inputs,
        "--compute-types",
        compute_type,
        "--repeats",
        str(repeats),
        "--stock",
        "--out",
        out,
    ]
    if drafter != "shipped":
        command += ["--drafter", drafter]
    if every_round:
        # At int8 the loop runs only with near_exact (not exact there); the network is what is measured.
        command += ["--draft-every-round"] + (["--near-exact"] if compute_type != "float32" else [])
    if not os.path.isfile(os.path.join(out, "bench.json")):
        subprocess.run(command, check=True)
    with open(os.path.join(out, "bench.json"), encoding="utf-8") as stream:
        (setting,) = json.load(stream)["settings"]
    summary = setting["summary"]
    return {
        "whole_vs_same_engine": summary["speedup"]["whole"],
        "decode_vs_same_engine": summary["speedup"]["decode"],
        "whole_vs_stock": (summary["speedup_vs_stock"] or {}).get("whole"),
        "decode_vs_stock": (summary["speedup_vs_stock"] or {}).get("decode"),
        "tokens_per_target_call": summary["tokens_per_target_call"],
        "identical": summary["token_identity"],
        "identical_to_stock": summary.get("stock_token_identity"),
        "loop_rows": summary["speculative_rows"],
        "generate_rows": summary["generate_rows"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--domain", default="mfa", choices=sorted(OTHER))
    parser.add_argument("--holdout", type=float, default=0.5)
    parser.add_argument("--compute-type", default="float32")
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--sets", nargs="+", default=["held_out", "other", "test_clips"], choices=["held_out", "other", "test_clips"]
    )
    parser.add_argument("--modes", nargs="+", default=["defaults", "every_round"], choices=["defaults", "every_round"])
    parser.add_argument("--work", default=os.path.join(os.path.expanduser("~"), ".cache", "ct2_flash", "adapt"))
    parser.add_argument("--out", default="bench/results/adapt")
    args = parser.parse_args()
    from ct2_flash.benchmark.speech_sets import fetch

    os.makedirs(args.work, exist_ok=True)
    drafter = adapt_domain(args.domain, args.holdout, args.compute_type, args.work, args.minutes)
    name = f"{args.domain}_{args.compute_type}"
    results_dir = os.path.join(args.out, name)
    os.makedirs(results_dir, exist_ok=True)
    for report in ("adapt_report.json", "adapt_report.png"):
        shutil.copy(os.path.join(drafter, report), os.path.join(results_dir, report))
    sets: Dict[str, List[str]] = {
        "held_out": [
            "--manifest",
            held_out_manifest(args.domain, drafter, os.path.join(args.work, f"{name}_held_out.tsv")),
        ],
        "other": ["--manifest", fetch(OTHER[args.domain])],
        "test_clips": ["--audio-dir", TEST_CLIPS],
    }
    # Sets measured by an earlier run stay (a run may measure some sets only).
    previous = os.path.join(results_dir, "domains.json")
    results: Dict[str, dict] = {}
    if os.path.isfile(previous):
        with open(previous, encoding="utf-8") as stream:
            results = json.load(stream)["results"]
    for set_name in args.sets:
        inputs = sets[set_name]
        for mode in args.modes:
            for which, path in (("shipped", "shipped"), ("adapted", drafter)):
                runs = os.path.join(args.work, "bench", name, set_name, mode, which)
                results.setdefault(set_name, {}).setdefault(mode, {})[which] = bench(
                    inputs, path, args.compute_type, args.repeats, mode == "every_round", runs
                )
    document = {
        "domain": args.domain,
        "holdout": args.holdout,
        "compute_type": args.compute_type,
        "command": " ".join(sys.argv),
        "results": results,
    }
    write_result(os.path.join(results_dir, "domains.json"), document)
    plot(document, os.path.join(results_dir, "domains.png"))


def plot(document: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 3.5))
    names = list(document["results"])
    width = 0.35
    for offset, which in ((-width / 2, "shipped"), (width / 2, "adapted")):
        left.bar(
            [i + offset for i in range(len(names))],
            [
                document["results"][n].get("every_round", {}).get(which, {}).get("tokens_per_target_call") or 0
                for n in names
            ],
            width,
            label=which,
        )
        right.bar(
            [i + offset for i in range(len(names))],
            [
                document["results"][n]
                .get("defaults", {})
                .get(which, {})
                .get("whole_vs_same_engine", {})
                .get("speedup", 0)
                for n in names
            ],
            width,
            label=which,
        )
    left.set(xticks=range(len(names)), xticklabels=names, title="tokens per target call, every round drafting")
    right.axhline(1.0, color="grey", linewidth=0.8)
    right.set(
        xticks=range(len(names)),
        xticklabels=names,
        title=f"whole path vs faster-whisper, same engine ({document['compute_type']}, defaults)",
    )
    left.legend()
    save_figure(figure, path)


if __name__ == "__main__":
    main()
