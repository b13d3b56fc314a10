"""``python -m ct2_flash.train STEP``: the resumable steps of drafter training."""

from __future__ import annotations

import argparse
import logging
import os


def default_data_dir() -> str:
    return os.environ.get("CT2_FLASH_DATA", os.path.join(os.path.expanduser("~"), ".cache", "ct2_flash", "drafter_data"))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m ct2_flash.train", description=__doc__)
    parser.add_argument("--data", default=default_data_dir(), help="data directory (default: %(default)s)")
    steps = parser.add_subparsers(dest="step", required=True)
    synth = steps.add_parser("synth", help="synthesize speech (resumable)")
    synth.add_argument("--hours", type=float, default=10.0)
    synth.add_argument("--seed", type=int, default=0)
    synth.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    if args.step == "synth":
        from .synth import synthesize

        entries = synthesize(args.data, args.hours, seed=args.seed, workers=args.workers)
        hours = sum(e["seconds"] for e in entries) / 3600
        logging.info("%d utterances, %.2f h in %s", len(entries), hours, args.data)


if __name__ == "__main__":
    main()
