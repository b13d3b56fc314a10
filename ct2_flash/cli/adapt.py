"""``ct2-flash adapt``: fine-tune the drafter on a user's own recordings."""

from __future__ import annotations

import argparse
import errno
import sys


def add_parser(commands) -> argparse.ArgumentParser:
    """The ``adapt`` subcommand's arguments."""
    adapt = commands.add_parser(
        "adapt", help="fine-tune the drafter on your own recordings (no transcripts; needs [train])"
    )
    adapt.add_argument("audio", nargs="+", help="audio files or folders (searched recursively)")
    adapt.add_argument("--out", required=True, help="drafter directory to write (its work goes to OUT.adapt/)")
    adapt.add_argument("--model", default="tiny.en", help="embedded model name or model directory")
    adapt.add_argument(
        "--compute-type",
        default="float32",
        choices=["float32", "int8", "int8_float32", "int16"],
        help="the compute type the drafter will serve (default: float32, where the loop is exact)",
    )
    adapt.add_argument("--from", dest="start", default=None, help="drafter to start from (default: the shipped one)")
    adapt.add_argument(
        "--minutes",
        type=float,
        default=60.0,
        help="wall time this run may take; training stops early to fit (default: 60)",
    )
    adapt.add_argument("--holdout", type=float, default=0.2, help="fraction of the files held out to measure on")
    adapt.add_argument(
        "--steps",
        type=int,
        default=None,
        help="fine-tuning updates (default: 40 per minute of training audio, 100-1500)",
    )
    adapt.add_argument("--lr", type=float, default=1e-4, help="peak learning rate (default: %(default)s)")
    adapt.add_argument("--train", default="all", choices=["all", "last-layer"], help="which weights learn")
    adapt.add_argument(
        "--all-audio", action="store_true", help="blocks read all of the audio, not the runtime's window"
    )
    adapt.add_argument(
        "--speed-copies",
        type=int,
        default=0,
        help="also label each training window at this many other speeds, 0.9-1.1x (default: 0)",
    )
    adapt.add_argument(
        "--bf16",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="bfloat16 autocast in training (default: where the CPU has bf16 instructions)",
    )
    adapt.add_argument("--threads", type=int, default=2)
    adapt.add_argument("--resume", action="store_true", help="go on with the work a killed run left in OUT.adapt/")
    adapt.add_argument("--force", action="store_true", help="replace OUT and start the work over")
    adapt.set_defaults(handler=run)
    return adapt


def run(args: argparse.Namespace) -> int:
    from ct2_flash.train.adapt import AdaptError, AdaptOptions, adapt, summary_lines, work_dir_for

    try:
        options = AdaptOptions(
            model=args.model,
            compute_type=args.compute_type,
            start=args.start,
            minutes=args.minutes,
            holdout=args.holdout,
            steps=args.steps,
            learning_rate=args.lr,
            trained=args.train,
            audio_window=not args.all_audio,
            threads=args.threads,
            bf16=args.bf16,
            speed_copies=args.speed_copies,
        )
        report = adapt(args.audio, args.out, options, resume=args.resume, force=args.force)
    except (ValueError, FileExistsError, FileNotFoundError, AdaptError) as error:
        print(f"ct2-flash adapt: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            f"ct2-flash adapt: interrupted; what was done is kept in {work_dir_for(args.out)}: run the same command "
            f"with --resume to go on",
            file=sys.stderr,
        )
        return 130
    except OSError as error:
        if error.errno != errno.ENOSPC:
            raise
        print(
            f"ct2-flash adapt: the disk is full ({error}); what was done is kept: free some space and run the "
            f"same command with --resume",
            file=sys.stderr,
        )
        return 2
    for line in summary_lines(report):
        print(line)
    print(
        f"wrote {args.out} (use it: FlashWhisperModel(..., drafter={args.out!r}) or "
        f"ct2-flash transcribe --drafter {args.out})"
    )
    return 0
