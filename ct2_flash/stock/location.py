"""Where the stock engine lives: a private ``pip install --target`` directory inside the
project's environment, put first on the worker's ``sys.path`` only.

A directory, not a second virtual environment, so that nobody has to manage one; not the
environment's own ``site-packages``, where stock ``ctranslate2`` would overwrite the patched
runtime (docs/install.md). ``pip check`` does not look into it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Dict

# The stock release users get with ``pip install faster-whisper`` today, pinned.
STOCK_CTRANSLATE2 = "4.8.5"


def stock_dir() -> str:
    """The directory stock ``ctranslate2`` is installed into (``CT2_FLASH_STOCK_DIR`` moves it)."""
    return os.environ.get("CT2_FLASH_STOCK_DIR") or os.path.join(sys.prefix, "ct2_flash_stock", STOCK_CTRANSLATE2)


def environment_with(directory: str) -> Dict[str, str]:
    """A copy of this process's environment with ``directory`` (a stock install, usually
    ``stock_dir()``) first on ``PYTHONPATH``: a child Python then imports stock ``ctranslate2``.
    An empty ``directory`` leaves the path as it is."""
    environment = dict(os.environ)
    if directory:
        environment["PYTHONPATH"] = os.pathsep.join(filter(None, [directory, environment.get("PYTHONPATH", "")]))
    return environment


def installed(directory: str = "") -> bool:
    """Whether ``directory`` (default ``stock_dir()``) holds the pinned stock release."""
    directory = directory or stock_dir()
    return os.path.isdir(os.path.join(directory, "ctranslate2")) and os.path.isdir(
        os.path.join(directory, f"ctranslate2-{STOCK_CTRANSLATE2}.dist-info")
    )


def install(directory: str = "") -> str:
    """Install the pinned stock ``ctranslate2`` into ``directory`` (its dependencies, numpy and
    pyyaml, come from the environment itself); returns the directory.

    Raises:
        RuntimeError: pip failed (its message included).
    """
    directory = directory or stock_dir()
    if installed(directory):
        return directory
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--upgrade",
            "--target",
            directory,
            f"ctranslate2=={STOCK_CTRANSLATE2}",
        ],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0 or not installed(directory):
        raise RuntimeError(
            f"could not install stock ctranslate2=={STOCK_CTRANSLATE2} into {directory}:\n{result.stderr.strip()}"
        )
    return directory
