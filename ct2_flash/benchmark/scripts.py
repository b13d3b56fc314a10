"""What every script under ``bench/`` shares: the machine it ran on, timing a call, writing a
result. Benchmarks compare systems as ratios from one run; the functions below only time and
record, they never decide what is faster.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from ct2_flash.benchmark.machine import machine  # the CPU a figure came from: one definition for runner and scripts

# The committed test clips (tests/data of the checkout), which several scripts measure on.
TEST_CLIPS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tests", "data")


def timed(function: Callable[[], Any]) -> Tuple[float, Any]:
    """(wall seconds, result) of one call."""
    started = time.perf_counter()
    result = function()
    return time.perf_counter() - started, result


def median_ms(function: Callable[[], Any], repeats: int, warmup: int = 3) -> float:
    """Median wall time of ``function()`` in ms over ``repeats`` calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        function()
    return 1000 * statistics.median(timed(function)[0] for _ in range(repeats))


def lowest_median_ms(
    function: Callable[[], Any],
    repeats: int,
    groups: int = 4,
    warmup: int = 5,
    before: Optional[Callable[[], Any]] = None,
) -> float:
    """The lowest of ``groups`` medians of ``repeats / groups`` timed calls: other work on the
    two cores only ever adds time, so the quietest group is the closest to the cost itself.
    ``before``, if given, runs untimed before each call (warm-ups included)."""

    def once() -> float:
        if before is not None:
            before()
        return timed(function)[0]

    for _ in range(warmup):
        once()
    per_group = max(1, repeats // groups)
    return 1000 * min(statistics.median(once() for _ in range(per_group)) for _ in range(groups))


def interleaved(systems: Dict[str, Callable[[], Any]], repeats: int, warmup: int = 1) -> Dict[str, List[Any]]:
    """Each system's call ``warmup`` times untimed, then ``repeats`` rounds in which every
    system runs once in turn, so that load drift hits all of them alike; returns per system
    what its calls returned (seconds, or a measurement), in order."""
    for _ in range(warmup):
        for call in systems.values():
            call()
    results: Dict[str, List[Any]] = {name: [] for name in systems}
    for _ in range(repeats):
        for name, call in systems.items():
            results[name].append(call())
    return results


def time_calls(owner: Any, name: str, record: Callable[[float], None]) -> Callable[[], None]:
    """Patch ``owner.name`` (a class or an instance) so that each call's wall seconds go to
    ``record``; returns the function that undoes the patch."""
    function = getattr(owner, name)
    had_own = name in getattr(owner, "__dict__", {})

    def timed_call(*args, **kwargs):
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            record(time.perf_counter() - started)

    setattr(owner, name, timed_call)

    def undo() -> None:
        if had_own:
            setattr(owner, name, function)
        else:  # an instance patch over its class's method: drop it
            delattr(owner, name)

    return undo


def write_result(path: str, document: Dict[str, Any], echo: Optional[Iterable[str]] = None) -> None:
    """Write ``document`` as JSON to ``path`` (folders made as needed), with ``machine()`` added
    unless it names its own; print the keys in ``echo`` (all of it for ``echo=()``)."""
    document.setdefault("machine", machine())
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    with open(path, "w", encoding="utf-8") as stream:
        json.dump(document, stream, indent=2)
    if echo is not None:
        keys = list(echo)
        print(json.dumps({key: document[key] for key in keys} if keys else document, indent=2))


def save_figure(figure, path: str) -> None:
    """Lay out, write (110 dpi PNG, folders made as needed) and close a matplotlib figure."""
    import matplotlib.pyplot as plt

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def record_verifications(runtime, passes: list) -> None:
    """Record every verification of the sequences ``runtime.start`` returns from now on, as
    (cache length before, tokens, raw rows [T, vocab] copied); ``del runtime.start`` stops it."""
    start = runtime.start

    def recording_start(encoder_output, prompt):
        prefill = start(encoder_output, prompt)
        sequence, verify = prefill.sequence, prefill.sequence.verify

        def recording_verify(tokens):
            length = sequence.length
            rows = verify(tokens)
            passes.append((length, [int(t) for t in tokens], rows.copy()))
            return rows

        sequence.verify = recording_verify
        return prefill

    runtime.start = recording_start
