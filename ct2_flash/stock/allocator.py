"""The memory allocator a CPU user can choose without code, for a process that runs CTranslate2.

CTranslate2 allocates every operation's output afresh and frees it after. Under glibc's
default settings a large block (an encoder layer's attention scores) is a new mapping each
time, faulted in and zero-filled again, and many small ones go through glibc's locks. Two
settings that need no code fix that: tcmalloc preloaded (``LD_PRELOAD=libtcmalloc_minimal.so.4``,
Debian's ``libgoogle-perftools4``; what PyTorch's CPU launcher and Intel's recipes set), or,
without it, glibc's own environment variables (``GLIBC_SETTINGS``: one arena, no mappings for
large blocks, never trim). The benchmark's tuned stock system runs faster-whisper under one of
them, and the stock engine's worker runs under it too (``CT2_FLASH_WORKER_ALLOCATOR``).

A preload the platform refuses (a missing or broken library) is ignored by the dynamic loader
with a message on stderr, so what a process actually runs is read from its memory maps
(``loaded_allocator``), never assumed.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Dict, Mapping, Optional

TCMALLOC = "libtcmalloc_minimal.so.4"
# Where Debian, Ubuntu, Fedora and Alpine put it (the loader's own search path, by file name).
_LIBRARY_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/lib",
    "/lib/x86_64-linux-gnu",
    "/lib64",
    "/lib",
)
# glibc's tunables as environment variables: what keep_freed_memory() in the worker sets with
# mallopt, for a process whose code one cannot change.
GLIBC_SETTINGS: Dict[str, str] = {
    "MALLOC_ARENA_MAX": "1",
    "MALLOC_MMAP_MAX_": "0",
    "MALLOC_TRIM_THRESHOLD_": "1073741824",
}


@dataclass(frozen=True)
class Allocator:
    """An allocator setting for a child process.

    Attributes:
        name: "tcmalloc", "glibc settings" or "glibc" (the default, nothing set).
        library: the file preloaded, or None.
        variables: environment variables the setting adds (``LD_PRELOAD`` included).
    """

    name: str
    library: Optional[str]
    variables: Mapping[str, str]

    def environment(self, base: Mapping[str, str]) -> Dict[str, str]:
        """``base`` with this setting's variables; a library goes before any preload already there."""
        environment = dict(base)
        for key, value in self.variables.items():
            if key == "LD_PRELOAD" and environment.get(key):
                value = f"{value}:{environment[key]}"
            environment[key] = value
        return environment

    def describe(self) -> str:
        return f"{self.name} ({self.library})" if self.library else self.name


GLIBC_DEFAULT = Allocator("glibc", None, {})


def find_tcmalloc() -> Optional[str]:
    """The path of tcmalloc's minimal library, or None. ``CT2_FLASH_TCMALLOC`` names another file."""
    named = os.environ.get("CT2_FLASH_TCMALLOC")
    if named:
        return named if os.path.isfile(named) else None
    for directory in _LIBRARY_DIRS:
        path = os.path.join(directory, TCMALLOC)
        if os.path.isfile(path):
            return path
    return None


def tuned_allocator() -> Allocator:
    """The best setting reachable without code on this machine: tcmalloc preloaded where the
    library is present, else glibc's environment settings."""
    library = find_tcmalloc()
    if library is not None:
        return Allocator("tcmalloc", library, {"LD_PRELOAD": library})
    return Allocator("glibc settings", None, dict(GLIBC_SETTINGS))


def chosen_allocator(variable: str) -> str:
    """ "tcmalloc" (the default) or "glibc", as the environment variable ``variable`` asks.

    Raises:
        ValueError: any other value.
    """
    choice = os.environ.get(variable, "tcmalloc")
    if choice not in ("tcmalloc", "glibc"):
        raise ValueError(f"{variable}={choice!r}: use 'tcmalloc' or 'glibc'")
    return choice


def loaded_allocator(pid: int) -> str:
    """Which allocator process ``pid`` runs: "tcmalloc" if a tcmalloc library is mapped in it,
    else "glibc" (its memory maps, so a refused preload shows as glibc). "unknown" where the
    maps cannot be read (not Linux, or the process is gone)."""
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as stream:
            maps = stream.read()
    except OSError:
        return "unknown"
    return "tcmalloc" if "libtcmalloc" in maps else "glibc"


# Set in a command re-executed under tcmalloc (``preload_for_command``): the LD_PRELOAD it had
# before ("" for none), so the command neither loops nor hands its preload to its children.
_PRELOADED = "CT2_FLASH_PRELOADED_FROM"


def preload_for_command() -> None:
    """Run this command again with tcmalloc preloaded, as tuned stock's users run faster-whisper,
    where the library is installed and not loaded yet: ``os.execve`` of this interpreter with
    its command line (``sys.orig_argv``; call this before the command does anything: the process
    is replaced). Does nothing where ``CT2_FLASH_ALLOCATOR=glibc``, where tcmalloc is missing or
    already loaded, before Python 3.10, or in the command run again (its former ``LD_PRELOAD`` is
    put back in ``os.environ`` there, for its children). A preload the loader refuses leaves
    glibc (the loader says so on stderr) and the command runs.
    """
    if _PRELOADED in os.environ:
        before = os.environ.pop(_PRELOADED)
        if before:
            os.environ["LD_PRELOAD"] = before
        else:
            os.environ.pop("LD_PRELOAD", None)
        return
    choice = chosen_allocator("CT2_FLASH_ALLOCATOR")
    command = getattr(sys, "orig_argv", None)  # Python 3.10+
    tuned = tuned_allocator()
    if choice == "glibc" or not command or tuned.library is None or loaded_allocator(os.getpid()) != "glibc":
        return
    environment = tuned.environment(os.environ)
    environment[_PRELOADED] = os.environ.get("LD_PRELOAD", "")
    os.execve(sys.executable, command, environment)
