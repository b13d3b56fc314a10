"""``ct2-flash run``: run a faster-whisper client with ct2-flash in place of its WhisperModel."""

from __future__ import annotations

import argparse
import sys


def add_parser(commands) -> argparse.ArgumentParser:
    """The ``run`` subcommand's arguments."""
    parser = commands.add_parser(
        "run",
        help="run a Python program (a faster-whisper client) with ct2-flash in place of faster_whisper.WhisperModel",
    )
    parser.add_argument("--drafter", default=None, help="drafter directory for every model (default: the shipped one)")
    parser.add_argument("--num-draft-tokens", type=int, default=8, help="K, the most tokens proposed per verification")
    parser.add_argument(
        "--stats",
        default=None,
        metavar="FILE",
        help="write at exit a JSON of what the models did (rows in the loop / through generate() / "
        "passed on unchanged: beam search, int8; tokens per target call)",
    )
    parser.add_argument(
        "program",
        nargs=argparse.REMAINDER,
        help="-- PROGRAM ARGS...: a console script (this environment's, else on PATH), -m MODULE, or a .py file",
    )
    parser.set_defaults(handler=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from ct2_flash.dropin import swap as dropin
    from ct2_flash.dropin.run import ProgramError, find_program, run

    try:
        program = find_program(args.program)
        dropin.install(drafter=args.drafter, num_draft_tokens=args.num_draft_tokens, program=program.name)
    except (ProgramError, ValueError, FileNotFoundError) as error:
        print(f"ct2-flash run: {error}", file=sys.stderr)
        return 2
    return run(program, args.stats)
