"""``ct2-flash convert-drafter``: export a trained drafter for the runtime."""

from __future__ import annotations

import argparse
import sys


def add_parser(commands) -> argparse.ArgumentParser:
    """The ``convert-drafter`` subcommand's arguments."""
    convert = commands.add_parser(
        "convert-drafter", help="a drafter checkpoint -> ONNX graphs the runtime runs (needs [train])"
    )
    convert.add_argument("checkpoint", help="drafter checkpoint directory (drafter.json + drafter.safetensors)")
    convert.add_argument("out", help="output directory (may be the checkpoint itself, with --force)")
    convert.add_argument("--model", default=None, help="target model directory (default: the embedded model it names)")
    convert.add_argument(
        "--audio", nargs="*", default=[], help="audio files for verification (default: bundled sample)"
    )
    convert.add_argument("--force", action="store_true", help="overwrite the drafter files in OUT")
    convert.set_defaults(handler=run)
    return convert


def run(args: argparse.Namespace) -> int:
    try:
        from ct2_flash.converters import ConversionError, convert_drafter
    except ImportError as error:
        print(
            f"ct2-flash convert-drafter needs PyTorch and onnx ({error.name} is missing): "
            "pip install 'ct2-flash[train]' (in a checkout: pip install -e '.[train]')",
            file=sys.stderr,
        )
        return 2
    from ct2_flash.drafting.files import CheckpointError, DrafterMismatchError

    try:
        manifest = convert_drafter(args.checkpoint, args.out, args.model, force=args.force, audio=args.audio)
    except (FileExistsError, CheckpointError, DrafterMismatchError, ConversionError) as error:
        print(f"ct2-flash convert-drafter: {error}", file=sys.stderr)
        return 2
    for precision, check in manifest.verification.items():
        print(
            f"{precision}: top-1 agreement with PyTorch {check['top1_agreement']:.2%} over {check['positions']} "
            f"anchors (by position {', '.join(f'{a:.0%}' for a in check['top1_agreement_by_position'])}), "
            f"max log-probability difference {check['max_log_prob_difference']:.2e}"
        )
    print(f"wrote {args.out}")
    return 0
