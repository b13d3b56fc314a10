"""The one place time is measured: timed stand-ins for the target sequence and the drafter, the
decode call's own bookkeeping, and a stopwatch for everything else that times a block.

The decode loop calls the target and the drafter only through ``TimedTarget`` and
``TimedDrafter``; each call's wall time goes into ``SpecStats`` (``verify_seconds``: the
engine's passes and rollbacks; ``drafter_seconds``: the drafter's calls and the state recovery
that feeds it) and into a ``RoundClock``, which hands DraftPause and DraftLengths
what one round cost; ``call_bookkeeping`` adds what the loop itself spent (``other_seconds``).
The round itself then reads as the algorithm, with no timers in it. ``Stopwatch`` times the
rest (the encoder, ``generate()`` calls, the thread-split measurement, benchmark passes).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ct2_flash.drafting.base import Drafter, DraftWindow, Proposal
from ct2_flash.loop.stats import SpecStats


class Stopwatch:
    """Wall seconds of a block (``time.perf_counter``)::

        with Stopwatch() as watch:
            ...
        watch.seconds  # the block's; watch.elapsed while it runs

    ``seconds`` is set when the block ends, also when it raises.
    """

    __slots__ = ("started", "seconds")

    def __enter__(self) -> "Stopwatch":
        self.started, self.seconds = time.perf_counter(), 0.0
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.perf_counter() - self.started

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.started


@contextmanager
def call_bookkeeping(stats: SpecStats) -> Iterator[None]:
    """Around one decode call: adds to ``stats.other_seconds`` the call's wall time less what
    the engine and the drafter spent in it (the loop's own bookkeeping)."""
    spent_before = stats.verify_seconds + stats.drafter_seconds
    with Stopwatch() as watch:
        try:
            yield
        finally:
            spent = stats.verify_seconds + stats.drafter_seconds - spent_before
            stats.other_seconds += watch.elapsed - spent


@dataclass
class RoundClock:
    """What the current round has cost so far, reset by ``start``.

    Attributes:
        started: ``time.perf_counter()`` at the round's start.
        verify_seconds: the engine's time in this round (passes and rollback).
        drafter_seconds: the drafter's time in this round.
        propose_seconds: the proposal alone (the draft-length policy's proposal cost).
    """

    started: float = 0.0
    verify_seconds: float = 0.0
    drafter_seconds: float = 0.0
    propose_seconds: float = 0.0

    def start(self) -> None:
        self.started = time.perf_counter()
        self.verify_seconds = self.drafter_seconds = self.propose_seconds = 0.0

    @property
    def elapsed(self) -> float:
        """Wall seconds since ``start``."""
        return time.perf_counter() - self.started


class TimedTarget:
    """The target sequence of one window (``TargetRuntime.start``'s), timed and counted.

    Args:
        sequence: the runtime's sequence (``verify`` [n] -> [n, vocab] logits, ``rollback``,
            ``length``, ``attention_peaks``).
        stats: where engine time and target calls add up.
        clock: the round's clock.
    """

    def __init__(self, sequence, stats: SpecStats, clock: RoundClock) -> None:
        self.sequence, self._stats, self._clock = sequence, stats, clock

    @property
    def length(self) -> int:
        """Positions in the target's cache."""
        return self.sequence.length

    @property
    def attention_peaks(self) -> Optional[np.ndarray]:
        """[n] the encoder frame each row of the last pass read most (alignment heads), or None."""
        return self.sequence.attention_peaks

    def verify(self, tokens: Sequence[int]) -> np.ndarray:
        """[len(tokens), vocab] float32 logits; the cache grows by len(tokens)."""
        started = time.perf_counter()
        try:
            return self.sequence.verify(tokens)
        finally:
            self._charge(time.perf_counter() - started)
            self._stats.target_calls += 1

    def rollback(self, length: int) -> None:
        """Cut the cache back to ``length`` positions: the engine's work, so its time counts
        with the verification that made the rows it drops."""
        started = time.perf_counter()
        try:
            self.sequence.rollback(length)
        finally:
            self._charge(time.perf_counter() - started)

    def _charge(self, seconds: float) -> None:
        self._stats.verify_seconds += seconds
        self._clock.verify_seconds += seconds


def timed_prefill(runtime, encoder_output, prompt: List[int], stats: SpecStats, clock: RoundClock):
    """``runtime.start(encoder_output, prompt)`` (the prefill pass), timed as a target call;
    returns the prefill result and its sequence wrapped in a ``TimedTarget``."""
    started = time.perf_counter()
    try:
        prefill = runtime.start(encoder_output, prompt)
    finally:
        stats.verify_seconds += time.perf_counter() - started
        stats.target_calls += 1
    return prefill, TimedTarget(prefill.sequence, stats, clock)


class TimedDrafter:
    """The drafter for one window, timed; it also recovers the target states it is given.

    Args:
        drafter: the drafter.
        runtime: the target runtime (its ``decoder_states`` / ``states_from_columns`` give the
            drafter its history; that recovery is the drafter's cost, not the engine's).
        stats, clock: where drafter time adds up.
    """

    def __init__(self, drafter: Drafter, runtime, stats: SpecStats, clock: RoundClock) -> None:
        self.drafter, self._runtime, self._stats, self._clock = drafter, runtime, stats, clock

    @property
    def needs_states(self) -> bool:
        return self.drafter.needs_states

    def begin(self, window: DraftWindow, first_logits: np.ndarray, length: int) -> None:
        """Start a window; the history starts with the last prompt position, whose logits
        [vocab] prefill gave, at cache ``length``."""
        with self._timing():
            self.drafter.begin(window)
            if self.drafter.needs_states:
                self.drafter.advance(self._runtime.decoder_states(first_logits[None]), length)

    def propose(self, generated: Sequence[int], count: int) -> Proposal:
        """The drafter's ``propose``; its time is also the round's proposal cost."""
        started = time.perf_counter()
        with self._timing():
            proposal = self.drafter.propose(generated, count)
        self._clock.propose_seconds += time.perf_counter() - started
        return proposal

    def offered(self, generated: Sequence[int], limit: int) -> Tuple[int, ...]:
        """The drafter's ``offered`` tokens (their time is the drafter's, not a proposal's)."""
        with self._timing():
            return self.drafter.offered(generated, limit)

    def observe_position(self, frame: int) -> None:
        with self._timing():
            self.drafter.observe_position(frame)

    def advance(self, columns: Optional[np.ndarray], length: int) -> None:
        """Hand the drafter the states of the rows the round kept ([rows, ...] columns of
        ``runtime.state_columns``, or None for a drafter without states) at cache ``length``."""
        with self._timing():
            states = self._runtime.states_from_columns(columns) if columns is not None else None
            self.drafter.advance(states, length)

    def advance_states(self, states: Optional[np.ndarray], length: int) -> None:
        """``advance`` with states already recovered ([rows, d], or None)."""
        with self._timing():
            self.drafter.advance(states, length)

    def states_of(self, columns: np.ndarray) -> np.ndarray:
        """[rows, d] states of state columns, kept for later (drafting paused)."""
        with self._timing():
            return self._runtime.states_from_columns(columns)

    def _timing(self):
        return _Charge(self._stats, self._clock)


class _Charge:
    """Adds a block's wall time to the drafter's time (stats and round)."""

    def __init__(self, stats: SpecStats, clock: RoundClock) -> None:
        self._stats, self._clock = stats, clock

    def __enter__(self) -> None:
        self._started = time.perf_counter()

    def __exit__(self, *exc) -> None:
        seconds = time.perf_counter() - self._started
        self._stats.drafter_seconds += seconds
        self._clock.drafter_seconds += seconds
