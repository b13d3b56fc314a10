"""``ct2-flash hook``: the start-up hook behind CT2_FLASH=1."""

from __future__ import annotations

import argparse
import os
import sys


def add_parser(commands) -> argparse.ArgumentParser:
    """The ``hook`` subcommand's arguments."""
    hook = commands.add_parser(
        "hook",
        help="CT2_FLASH=1 in this environment's Python programs: install, remove or "
        "show the start-up hook (a .pth file)",
    )
    hook.add_argument("action", choices=("install", "remove", "status"))
    hook.add_argument("--site-packages", default=None, help="where the .pth goes (default: this environment's)")
    hook.set_defaults(handler=run)
    return hook


def run(args: argparse.Namespace) -> int:
    import ct2_flash_hook

    path = ct2_flash_hook.pth_path(args.site_packages)
    present = os.path.isfile(path)
    if args.action == "install":
        try:
            with open(f"{path}.tmp", "w", encoding="utf-8") as stream:
                stream.write(ct2_flash_hook.PTH_LINE)
            os.replace(f"{path}.tmp", path)
        except OSError as error:
            print(
                f"ct2-flash hook: cannot write {path} ({error}); run it as the environment's owner, or pass "
                f"--site-packages DIR",
                file=sys.stderr,
            )
            return 2
        print(
            f"wrote {path}: Python programs of this environment started with {ct2_flash_hook.VARIABLE}=1 use "
            f"ct2-flash for faster_whisper.WhisperModel (remove: ct2-flash hook remove)"
        )
    elif args.action == "remove":
        if present:
            os.remove(path)
        print(f"removed {path}" if present else f"no hook at {path}")
    else:
        print(f"installed at {path}" if present else f"not installed (would be {path})")
    return 0
