"""``ct2-flash run -- PROGRAM ARGS...``: run a Python program with ct2-flash installed.

The program runs in this interpreter, as ``python PROGRAM ARGS`` would run it (``__main__``,
``sys.argv``, ``sys.path[0]``), after ``ct2_flash.install()``: every ``faster_whisper.WhisperModel``
it builds is ct2-flash's. In-process, like ``coverage run``, because replacing a class needs
the program's own interpreter; a program of another Python environment is refused with what
to do, since its packages are not importable here.

PROGRAM is a console script (``whisper-ctranslate2``: this environment's, else on PATH),
``-m module``, or a Python file.
Its exit code, stdin, stdout and stderr are its own; its exceptions print as Python prints
them (without ct2-flash's frames) and exit 1. ``--stats FILE`` is written at interpreter exit,
after the program's threads finish, and also when a SIGTERM ends a program that left SIGTERM's
default in place.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import shutil
import signal
import sys
import sysconfig
import threading
import traceback
from dataclasses import dataclass
from typing import List, Optional, Sequence

from ct2_flash.dropin import swap as dropin

PYTHON_SUFFIXES = (".py", ".pyw")


class ProgramError(ValueError):
    """The program cannot run under ``ct2-flash run``: not found, not Python, or another
    environment's."""


@dataclass(frozen=True)
class Program:
    """A program to run.

    Attributes:
        module: the module of ``-m module``, or None.
        path: the Python file to run (a script, or a console script on PATH), or None.
        argv: what ``sys.argv`` is while it runs (runpy sets ``argv[0]`` of a module).
    """

    module: Optional[str]
    path: Optional[str]
    argv: List[str]

    @property
    def name(self) -> str:
        return self.module or os.path.basename(self.path or "")


def find_program(command: Sequence[str]) -> Program:
    """The program ``command`` names (``["-m", "module", ...]``, ``["script.py", ...]`` or
    ``["console-script", ...]``).

    Raises:
        ProgramError: nothing to run, not found, not a Python program, or a console script of
            another Python environment.
    """
    command = list(command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ProgramError("no program given: ct2-flash run [OPTIONS] -- PROGRAM [ARGS...]")
    if command[0] == "-m":
        if len(command) < 2:
            raise ProgramError("-m needs a module name: ct2-flash run -- -m MODULE [ARGS...]")
        return Program(command[1], None, command[1:])
    name = command[0]
    # A console script of this environment first (a venv's ct2-flash run without the venv
    # activated), then PATH.
    path = (
        name
        if os.sep in name or os.path.isfile(name)
        else (shutil.which(name, path=sysconfig.get_path("scripts")) or shutil.which(name))
    )
    if path is None or not os.path.isfile(path):
        raise ProgramError(
            f"program {name!r} not found (not a file, and not a command on PATH): install it in this "
            f"Python environment ({sys.prefix}) or give its path"
        )
    _check_python(name, path)
    return Program(None, os.path.abspath(path), [path, *command[1:]])


def _check_python(name: str, path: str) -> None:
    """Refuse a file that is not a Python program, or one whose shebang names another
    environment's interpreter."""
    if path.endswith(PYTHON_SUFFIXES):
        return
    try:
        with open(path, "rb") as stream:
            first = stream.readline(512)
    except OSError as error:
        raise ProgramError(f"cannot read program {name!r} ({path}): {error}") from None
    if not first.startswith(b"#!") or b"python" not in first:
        raise ProgramError(
            f"{name!r} ({path}) is not a Python program: ct2-flash run runs Python programs (a console "
            "script, -m MODULE or a .py file), where it can replace faster_whisper.WhisperModel; "
            "for a program started another way, use CT2_FLASH=1 with ct2-flash hook install"
        )
    words = first[2:].decode("utf-8", "replace").split()
    interpreter = words[0] if words else ""
    if os.path.basename(interpreter) == "env" or not os.path.isabs(interpreter):
        return  # '#!/usr/bin/env python': whichever Python runs it; this one does
    environment = os.path.realpath(os.path.dirname(os.path.dirname(interpreter)))
    if environment != os.path.realpath(sys.prefix):
        raise ProgramError(
            f"{name!r} belongs to the Python environment at {environment}, not to ct2-flash's "
            f"({sys.prefix}): its packages are not importable here. Install ct2-flash into that "
            f"environment and use its ct2-flash, or install {name!r} into this one"
        )


def run(program: Program, stats_path: Optional[str] = None) -> int:
    """Run ``program`` to its end in this interpreter; returns its exit code (a SystemExit it
    raises passes through, as from Python itself)."""
    if stats_path:
        write_stats_at_exit(stats_path, program.name)
    sys.argv = list(program.argv)
    try:
        if program.module is not None:
            sys.path[0] = os.getcwd()  # as 'python -m' puts it
            runpy.run_module(program.module, run_name="__main__", alter_sys=True)
        else:
            sys.path[0] = os.path.dirname(program.path)  # as 'python FILE' puts it
            runpy.run_path(program.path, run_name="__main__")
    except (SystemExit, KeyboardInterrupt):
        raise
    except Exception as error:
        _print_program_error(error)
        return 1
    return 0


def write_stats_at_exit(path: str, program: str) -> None:
    """Write ``swap.stats()`` to ``path`` (JSON) when the interpreter exits."""
    atexit.register(_write_stats, path, program)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL and threading.current_thread() is threading.main_thread():
        # SIGTERM's default ends the process without exit handlers; as an exception, the stats
        # are still written (a program that handles SIGTERM itself keeps its handler).
        signal.signal(signal.SIGTERM, _exit_on_sigterm)


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)


def _print_program_error(error: BaseException) -> None:
    """The traceback Python would print for the program's uncaught exception, starting at
    the program's own frames."""
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_globals.get("__name__") in (__name__, runpy.__name__):
        tb = tb.tb_next
    traceback.print_exception(type(error), error, tb)


def _write_stats(path: str, program: str) -> None:
    report = dict(program=program, **dropin.stats())
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    temporary = f"{path}.tmp"
    with open(temporary, "w", encoding="utf-8") as stream:
        json.dump(report, stream, indent=1)
    os.replace(temporary, path)
