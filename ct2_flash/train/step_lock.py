"""One running copy per resumable step and directory.

Two copies of ``extract`` on one data directory both took the pending utterances and wrote
the same teacher files and records twice (it happened: a restart left the old process
running). Each step holds an exclusive lock on a file in its directory while it runs; a
second copy fails at once with the reason.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from typing import Iterator


@contextlib.contextmanager
def step_lock(directory: str, step: str) -> Iterator[None]:
    """Hold ``directory/.<step>.lock`` for the duration; RuntimeError if another process has it.

    The lock is the kernel's (``flock``): it goes away with the process however it ends.
    """
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f".{step}.lock")
    with open(path, "w", encoding="utf-8") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RuntimeError(
                f"another '{step}' step is already running on {directory} (it holds {path}); stop it first"
            ) from None
        handle.write(str(os.getpid()))
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
