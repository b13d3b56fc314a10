"""What a perfect drafter reaches on the held-out half of each adapted domain: the ceiling
``ct2-flash adapt`` works under.

For each domain, the held-out recordings are the ones ``ct2-flash adapt --holdout H`` holds
out (``user_audio.split_by_file``: the split is a stable hash of each path, so it needs no
adaptation run). ``ct2-flash bench --drafter oracle`` decodes them at float32 with every round
drafting K = 8 tokens that are always right (the oracle replays the target's own greedy
output): its tokens per target call is the most any drafter can reach there, since each window
still costs its prefill and ends where its text ends. Written beside the adapted drafters'
figures from ``bench/results/adapt/<domain>_float32/domains.json`` where those exist.

    python bench/studies/adapt_ceiling.py --out bench/results/adapt/ceiling.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from ct2_flash.benchmark.scripts import write_result

# Domain -> the held-out fraction its committed adaptation used (bench/run_all.sh).
HOLDOUTS = {"asterisk": 0.2, "mfa": 0.5}


def held_out_manifest(domain: str, holdout: float, path: str) -> int:
    """Writes the domain's held-out recordings (with references) to ``path``; returns how many."""
    from ct2_flash.benchmark.manifest import read_manifest, write_manifest
    from ct2_flash.benchmark.speech_sets import fetch
    from ct2_flash.train.user_audio import split_by_file

    utterances = read_manifest(fetch(domain, ""))
    split = split_by_file([u.path for u in utterances], holdout)
    held = [u for u in utterances if split[u.path] == "validation"]
    write_manifest(path, held)
    return len(held)


def adapted_figures(results: str, domain: str) -> dict:
    """Tokens per target call of the shipped and adapted drafters drafting every round on the
    same held-out half (float32), from the committed adaptation bench, or {}."""
    path = os.path.join(results, f"{domain}_float32", "domains.json")
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as stream:
        every_round = json.load(stream)["results"].get("held_out", {}).get("every_round", {})
    return {which: run["tokens_per_target_call"] for which, run in every_round.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--domains", nargs="+", default=sorted(HOLDOUTS), choices=sorted(HOLDOUTS))
    parser.add_argument("--work", default=os.path.join(os.path.expanduser("~"), ".cache", "ct2_flash", "adapt_ceiling"))
    parser.add_argument("--out", default="bench/results/adapt/ceiling.json")
    args = parser.parse_args()
    os.makedirs(args.work, exist_ok=True)
    results = {}
    for domain in args.domains:
        manifest = os.path.join(args.work, f"{domain}_held_out.tsv")
        count = held_out_manifest(domain, HOLDOUTS[domain], manifest)
        out = os.path.join(args.work, domain)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "ct2_flash.cli",
                "bench",
                "--no-stock-engine",
                "--manifest",
                manifest,
                "--drafter",
                "oracle",
                "--compute-types",
                "float32",
                "--repeats",
                "1",
                "--out",
                out,
            ],
            check=True,
        )
        with open(os.path.join(out, "bench.json"), encoding="utf-8") as stream:
            (setting,) = json.load(stream)["settings"]
        summary = setting["summary"]
        results[domain] = {
            "holdout": HOLDOUTS[domain],
            "recordings": count,
            "tokens": summary["generated_tokens"],
            "oracle_tokens_per_target_call": summary["tokens_per_target_call"],
            "identical": summary["token_identity"],
            "oracle_speedup_vs_same_engine": {
                part: summary["speedup"][part]["speedup"] for part in ("decode", "whole")
            },
            "every_round_tokens_per_target_call": adapted_figures(os.path.dirname(args.out), domain),
        }
        print(domain, results[domain], flush=True)
    write_result(
        args.out, {"what": __doc__.split("\n\n")[0], "command": " ".join(["python", *sys.argv]), "results": results}
    )


if __name__ == "__main__":
    main()
