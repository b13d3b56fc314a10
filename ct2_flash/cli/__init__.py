"""``ct2-flash`` command line: ``demo`` transcribes the bundled sample with both systems,
``transcribe`` writes transcripts of files, ``bench`` measures both on many files, ``stream`` replays a file as a
live stream, ``convert-drafter`` exports a trained drafter for the runtime, ``adapt`` fine-tunes the drafter on a
user's own recordings, ``run`` runs a faster-whisper client with ct2-flash in place of its
``WhisperModel``, ``fetch-speech`` downloads the real-speech sets.

Modules: one per subcommand, each with its parser and its handler (``demo``, ``transcribe``,
``bench``, ``stream``, ``convert`` for ``convert-drafter``, ``adapt``, ``fetch`` for
``fetch-speech``, ``run``, ``hook`` for ``ct2-flash hook``), and ``common``, what several share.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import List, Optional

from ct2_flash.cli import adapt, bench, convert, demo, fetch, hook, run, stream, transcribe

# Each subcommand imports what it uses in its own function: ``ct2-flash --help`` and
# ``ct2-flash run`` (which must leave faster-whisper unloaded until the program imports it)
# then load none of the engine, the benchmark or training code.
SUBCOMMANDS = (demo, transcribe, bench, stream, convert, adapt, fetch, run, hook)
# The commands that transcribe run under tcmalloc where it is installed, as tuned stock does
# (``stock.allocator.preload_for_command``); ``ct2-flash`` alone is ``demo``.
TRANSCRIBING = ("demo", "transcribe", "bench", "stream", "run")


def main(argv: Optional[List[str]] = None) -> int:
    """The command line; ``argv`` None is this process's own (``sys.argv``), the only one that
    may be run again under tcmalloc."""
    if argv is None and (sys.argv[1:2] or ["demo"])[0] in TRANSCRIBING:
        from ct2_flash.stock.allocator import preload_for_command

        preload_for_command()
    parser = argparse.ArgumentParser(prog="ct2-flash", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command")
    for subcommand in SUBCOMMANDS:
        subcommand.add_parser(commands)
    args = parser.parse_args(argv)
    if args.command == "run":
        # Before any logging setup of ours: the program configures logging as it would alone.
        return args.handler(args)
    logging.basicConfig(level=logging.WARNING)
    if args.command is None:
        args = parser.parse_args(["demo", *(argv or [])])
    if args.command == "adapt":
        logging.getLogger("ct2_flash").setLevel(logging.INFO)
    return args.handler(args)
