"""What ``CT2_FLASH=1`` does in a program once it has imported faster-whisper: the start-up hook
(the top-level ``ct2_flash_hook``, which must not import this package) calls
``install_from_environment()``.

``CT2_FLASH_DRAFTER`` and ``CT2_FLASH_NUM_DRAFT_TOKENS`` set ``install()``'s options;
``CT2_FLASH_STATS=FILE`` writes the models' counters at exit, as ``ct2-flash run --stats``.
"""

from __future__ import annotations

import os
import sys

from ct2_flash.dropin import run, swap


def install_from_environment() -> None:
    """``ct2_flash.install()`` with the options the environment sets, for this program."""
    tokens = os.environ.get("CT2_FLASH_NUM_DRAFT_TOKENS")
    program = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else None
    swap.install(
        drafter=os.environ.get("CT2_FLASH_DRAFTER") or None,
        num_draft_tokens=int(tokens) if tokens else 8,
        program=program,
    )
    stats = os.environ.get("CT2_FLASH_STATS")
    if stats:
        run.write_stats_at_exit(stats, program or "python")
