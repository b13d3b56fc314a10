"""The machine a figure came from, recorded with every result (these machines change CPU
between sessions, and costs move with it). Light: the adapter's and training's reports use it
too, without the benchmark's dependencies."""

from __future__ import annotations

import os
import platform


def machine() -> dict:
    """The CPU the figures came from (these machines change CPU between sessions): model name,
    the ISA flags CTranslate2's kernels depend on, cores, platform."""
    model, flags = "", []
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_int8", "avx_vnni")
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and not model:
                    model = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = [flag for flag in value.split() if flag in wanted]
    except OSError:
        pass
    return {
        "cpu": model or platform.processor(),
        "isa_flags": flags,
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
    }
