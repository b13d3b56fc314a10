"""``ct2-flash fetch-speech``: download the real-speech sets."""

from __future__ import annotations

import argparse
import sys


def add_parser(commands) -> argparse.ArgumentParser:
    """The ``fetch-speech`` subcommand's arguments."""
    fetch = commands.add_parser("fetch-speech", help="download the real-speech sets and write their manifests")
    fetch.add_argument("sets", nargs="*", help="mfa, pocketsphinx, asterisk (default: all)")
    fetch.add_argument("--cache", default="")
    fetch.set_defaults(handler=run)
    return fetch


def run(args: argparse.Namespace) -> int:
    from ct2_flash.benchmark.speech_sets import SETS, fetch

    for name in args.sets or list(SETS):
        try:
            print(fetch(name, args.cache))
        except (ValueError, RuntimeError) as error:
            print(f"ct2-flash fetch-speech: {error}", file=sys.stderr)
            return 2
    return 0
