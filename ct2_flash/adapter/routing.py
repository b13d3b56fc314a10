"""How each ``generate()`` call is served: whether the speculative loop may run it and why
not, whether it pays, and the routers that decide, measuring both ways.

``SpeculativeWhisper`` makes one ``Route`` per call (``SpeculativeWhisper.route``) from the
pieces here: ``inexact_reason`` (the model: a compute type or device where the loop is not
exact), ``ineligible_reason`` (the call's options), ``CallRoutes`` (the ``CallRouter`` that
decides between the loop and ``generate()``: one for greedy calls, one per sampling
temperature, one per length of a re-decode's previous hypothesis) and, for calls outside the
loop, the ``EngineRouter`` of ``engine_pair.Engines`` (which engine).

Speculation only pays when the drafter's accepted tokens save more target passes than the
draft rounds and the wider verification cost, which depends on the drafter, the audio, the
engine's kernels and the CPU. The in-window ``DraftPause`` can only fall back to plain
steps driven from Python, which cost more than CTranslate2's internal greedy loop. So the
adapter asks ``CallRouter`` per call: it keeps a running cost per token of both ways
(measured on the calls they served) and sends each call the cheaper way, probing the other one
now and then, since the audio or the machine's load can change which wins. The tokens are the
same either way: ``generate()`` is the call faster-whisper itself makes.

``generate()`` goes first: it is measured on the first call (of each batch size), and the
loop is first measured at the first probe, ``FIRST_PROBE_INTERVAL`` calls later and once
``generate()`` has decoded for ``FIRST_PROBE_SECONDS`` in the process. That first probe costs
what the loser loses on one call plus the loop's one-time setup (the patched model's load, the
drafter's sessions, the state-recovery solve, the score check), before anything tells which
way wins. The setup is paid once per process, so until something else has paid it (a
re-decode, a decode that outgrows its audio: ``CallRoutes.setup_paid``) the probe waits until
the decoding so far makes the setup a share no larger than a couple of later probes' budgets
(``PROBE_BUDGET``): a process that transcribes a few short files (a command-line run, a
serverless call) never pays it, a folder of short prompts pays it after many of them (the
figures: docs/measurements.md, "Figures behind the code's constants"). A loop that pays
starts that much late; a re-decode or a decode that outgrows its audio goes to the loop
without waiting (``RedecodeRouters``, ``SpeculativeWhisper``).

Probing the losing way costs its extra time once per interval, (loser / winner - 1) of a call.
The interval is at least what keeps that under ``PROBE_BUDGET`` of the decoding and doubles
each time a probe confirms the loser, up to ``MAX_PROBE_INTERVAL`` calls; so a way that loses
by 2x (a batch of 16 rows decoded one by one, say) is probed once in 64 calls, and one that
loses by a twentieth once in 4, then 8, ... calls.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

from ct2_flash.loop.options import DecodingOptions, draws_at_random

# The compute type at which a multi-token pass computes what single steps compute (to ~1e-5
# logits, far under any real decision's margin); elsewhere the loop runs only with near_exact.
EXACT_COMPUTE_TYPE = "float32"
BEAM_SEARCH = "beam search is not speculative"
UNOPENED_DRAFTER = "the drafter could not be opened"
# generate() options whose defaults make a call plain greedy decoding (CTranslate2 defaults
# beam_size to 5, so it must be given explicitly).
GREEDY_DEFAULTS: Dict[str, Any] = {
    "asynchronous": False,
    "repetition_penalty": 1,
    "no_repeat_ngram_size": 0,
    "return_logits_vocab": False,
}
# generate() options the loop implements (``DecodingOptions``), and those it reads as they are.
LOOP_OPTIONS = (
    "max_length",
    "suppress_blank",
    "max_initial_timestamp_index",
    "length_penalty",
    "sampling_topk",
    "sampling_temperature",
    "num_hypotheses",
)
_PASSED_OPTIONS = ("beam_size", "patience", "suppress_tokens", "return_scores", "return_no_speech_prob")


def inexact_reason(compute_type: str, near_exact: bool, device: str = "cpu") -> Optional[str]:
    """Why the loop may not run at ``compute_type`` on ``device`` (None: it may), the one place
    that decides."""
    if near_exact:
        return None
    if device != "cpu":
        # The float32 guard margin and the row scores follow CTranslate2's CPU kernels; a GPU's
        # passes round differently (docs/usage.md, "On a GPU").
        return f"on {device} the loop's exactness is not established, so the loop would not be exact"
    if compute_type == EXACT_COMPUTE_TYPE:
        return None
    return (
        f"at {compute_type} a multi-token pass is not the computation generate() makes, so the loop would not be exact"
    )


def ineligible_reason(prompts, options: Mapping[str, Any]) -> Optional[str]:
    """Why the loop cannot run ``generate(features, prompts, **options)`` (None: it can):
    beam search, several greedy hypotheses, an option the loop does not implement, prompts
    as token strings."""
    if options.get("beam_size", 5) != 1:
        return BEAM_SEARCH
    sampling = draws_at_random(options.get("sampling_topk", 1), options.get("sampling_temperature", 1.0))
    if options.get("num_hypotheses", 1) > 1 and not sampling:  # CTranslate2 decides (patience)
        return "several hypotheses without sampling are not speculative"
    for name, default in GREEDY_DEFAULTS.items():
        if options.get(name, default) != default:
            return f"generate(..., {name}={options[name]!r}) is not speculative"
    unknown = set(options) - set(GREEDY_DEFAULTS) - set(LOOP_OPTIONS) - set(_PASSED_OPTIONS)
    if unknown:
        return f"generate() options {sorted(unknown)} are not speculative"
    if any(not isinstance(t, (int, np.integer)) for prompt in prompts for t in prompt):
        return "prompts given as token strings are not speculative"
    return None


def decoding_options(options: Mapping[str, Any]) -> DecodingOptions:
    """The loop's ``DecodingOptions`` of an eligible call's ``generate()`` options; bad options
    raise here, before anything is decoded."""
    return DecodingOptions(
        suppress_tokens=tuple(int(t) for t in options.get("suppress_tokens", (-1,))),
        **{name: options[name] for name in LOOP_OPTIONS if name in options},
    )


FIRST_PROBE_INTERVAL = 16
FIRST_PROBE_SECONDS = 20.0
MAX_PROBE_INTERVAL = 64
# The share of decoding time probes may cost (see the module docstring).
PROBE_BUDGET = 0.01
# Weight of the newest call in the running cost: recent calls matter (load and audio drift),
# one odd call does not decide alone.
SMOOTHING = 0.3


def produced_tokens(results) -> int:
    """Tokens a ``generate()`` call produced, end-of-text included, over all rows and
    hypotheses: what both routers divide its time by."""
    return sum(len(ids) + 1 for result in results for ids in result.sequences_ids)


@dataclass
class CallRouter:
    """Chooses per call; one per model, shared by its threads (decisions are advisory, so a
    race between two threads only changes which way one call goes, never its tokens).

    Attributes:
        speculative_cost: running seconds per token of speculative calls, None before one.
        generate_cost: batch size -> running seconds per token of ``generate()`` calls (rows
            of a batch share one call, which is cheaper per token than one row at a time).
    """

    speculative_cost: Optional[float] = None
    generate_cost: Dict[int, float] = field(default_factory=dict)
    calls: int = 0
    probe_interval: int = FIRST_PROBE_INTERVAL
    next_probe: int = FIRST_PROBE_INTERVAL
    last_winner: Optional[bool] = None
    # Calls decoded in the loop before generate() is measured (re-decodes: the previous
    # hypothesis makes the loop the likely winner, and its first call pays one-time costs that
    # one measurement alone would hold against it), and the shortest interval between probes.
    loop_first: int = 0
    min_probe_interval: int = FIRST_PROBE_INTERVAL
    # The longest interval between probes (re-decodes: which way wins changes as the buffer
    # grows, so the loser is probed often whatever the budget says).
    max_probe_interval: int = MAX_PROBE_INTERVAL
    loop_calls: int = 0
    # Seconds of generate() the loop's first probe waits for while the loop's one-time setup is
    # not paid (``setup_paid``), and those recorded so far.
    first_probe_seconds: float = FIRST_PROBE_SECONDS
    generate_seconds: float = 0.0
    setup_paid: bool = False
    # way ("speculative" or a batch size) -> (running seconds, running tokens), see record().
    _running: Dict[object, Tuple[float, float]] = field(default_factory=dict, repr=False)

    def use_loop(self, batch_size: int) -> bool:
        """Whether the next call with ``batch_size`` rows should run speculatively."""
        generate_cost = self.generate_cost.get(batch_size)
        if self.loop_calls < self.loop_first:
            return True
        if generate_cost is None:
            return False  # the call faster-whisper makes, measured first
        self.calls += 1
        if self.speculative_cost is None:  # the loop is measured at the first probe
            waited = self.setup_paid or self.generate_seconds >= self.first_probe_seconds
            return self.calls >= self.next_probe and waited
        winner = self.speculative_cost <= generate_cost
        loss = max(self.speculative_cost, generate_cost) / max(min(self.speculative_cost, generate_cost), 1e-12) - 1.0
        affordable = math.ceil(loss / PROBE_BUDGET)  # calls per probe that keep its cost in budget
        if winner != self.last_winner:  # a new leader: probe the other way soon again
            self.last_winner = winner
            self.probe_interval = min(max(self.min_probe_interval, affordable), self.max_probe_interval)
            self.next_probe = self.calls + self.probe_interval
        if self.calls >= self.next_probe:
            self.probe_interval = min(max(2 * self.probe_interval, affordable), self.max_probe_interval)
            self.next_probe = self.calls + self.probe_interval
            return not winner
        return winner

    def record(self, speculative: bool, batch_size: int, seconds: float, tokens: int) -> None:
        """Fold one call into the running costs.

        A running cost is running seconds over running tokens, each smoothed alike: a call
        counts as much as the tokens it produced. Every call has a fixed part (the first step
        reads the whole encoder output), so a 5-token call costs 1.5-2x more per token than a
        100-token one on either way; weighting calls equally let one short call tip the choice
        (measured: four long windows in a row sent to a slower loop).

        Args:
            speculative: which way it ran.
            batch_size: rows in the call.
            seconds: its wall time, encoder output to last token.
            tokens: tokens it produced, end-of-text included, over all rows.
        """
        key = "speculative" if speculative else batch_size
        previous = self._running.get(key)
        tokens = max(tokens, 1)
        running = (
            (seconds, tokens)
            if previous is None
            else (
                (1 - SMOOTHING) * previous[0] + SMOOTHING * seconds,
                (1 - SMOOTHING) * previous[1] + SMOOTHING * tokens,
            )
        )
        self._running[key] = running
        if speculative:
            self.loop_calls += 1
            self.speculative_cost = running[0] / running[1]
        else:
            self.generate_cost[batch_size] = running[0] / running[1]
            self.generate_seconds += seconds


# Re-decodes (``RedecodeRouters``): previous hypotheses shorter than this many tokens share
# one router, and each doubling of the length has its own above it.
SHORTEST_BUCKET = 8
LONGEST_BUCKET = 64
# A bucket's router: calls measured in the loop before generate() is, and the shortest
# interval between probes of the loser (then doubled as CallRouter's budget allows).
REDECODE_LOOP_FIRST = 2
REDECODE_MIN_PROBE_INTERVAL = 8


class RedecodeRouters:
    """Which way a re-decode goes, by the length of its previous hypothesis (known before the
    call): one ``CallRouter`` per length bucket (under 8 tokens, 8-15, 16-31, 32-63, 64 or
    more).

    How well the loop pays on a re-decode follows how much of it the previous hypothesis
    covers: a 2 s buffer's few tokens leave a call the loop's fixed costs, a 25 s buffer's
    hypothesis covers most of its tokens. One router for all of them compared a running cost
    per token that moved with the buffer's length, and had to probe the loser every few calls
    to keep up; by bucket each compares like with like and probes within CallRouter's budget.
    Each bucket measures the loop first (``REDECODE_LOOP_FIRST`` calls), then ``generate()``.
    """

    def __init__(self) -> None:
        self._routers: Dict[int, CallRouter] = {}

    @staticmethod
    def bucket(hypothesis_tokens: int) -> int:
        """The bucket of a previous hypothesis of this many tokens: its lower bound."""
        size = SHORTEST_BUCKET
        while size < LONGEST_BUCKET and hypothesis_tokens >= 2 * size:
            size *= 2
        return 0 if hypothesis_tokens < SHORTEST_BUCKET else size

    def router(self, hypothesis_tokens: int) -> CallRouter:
        """The router for a re-decode whose previous hypothesis has this many tokens."""
        key = self.bucket(hypothesis_tokens)
        router = self._routers.get(key)
        if router is None:
            router = self._routers[key] = CallRouter(
                loop_first=REDECODE_LOOP_FIRST,
                min_probe_interval=REDECODE_MIN_PROBE_INTERVAL,
                probe_interval=REDECODE_MIN_PROBE_INTERVAL,
                next_probe=REDECODE_MIN_PROBE_INTERVAL,
            )
        return router

    @property
    def routers(self) -> Dict[int, CallRouter]:
        """Bucket (its lower bound in tokens) -> its router, for those used so far."""
        return dict(self._routers)


@dataclass(frozen=True)
class Route:
    """How one ``generate()`` call is served, decided once (``SpeculativeWhisper.route``).

    Attributes:
        ineligible: why the loop may not run the call (``inexact_reason``,
            ``ineligible_reason``, a drafter that could not be opened); None: it may.
        options: the call's ``DecodingOptions`` (None where ineligible).
        previous: the previous hypothesis of the call's window (a streaming client's
            re-decode), or None.
        router: the ``CallRouter`` that chose between the loop and ``generate()`` and is told
            what the call cost (None where ineligible).
        loop: whether the call goes to the loop (False where ineligible or the router chose
            ``generate()``; a loop another thread holds sends it to ``generate()`` after all,
            unless it waits).
        wait: whether the call waits for a loop another thread holds (a seeded model's
            sampling: its draws are the loop's) instead of going to ``generate()``.
        engine: the engine that serves the call outside the loop ("stock": the worker holding
            the encoding; "patched": the runtime in this process), chosen by the
            ``EngineRouter`` of ``engine_pair.Engines``; None for a call routed to the loop, whose
            engine is chosen only if it goes to ``generate()`` after all.
    """

    ineligible: Optional[str] = None
    options: Optional[DecodingOptions] = None
    previous: Optional[Tuple[int, ...]] = None
    router: Optional["CallRouter"] = None
    loop: bool = False
    wait: bool = False
    engine: Optional[str] = None


# How a call was served, once it ran (``Served.way``).
LOOP, GENERATE, CONTINUED, UNCHANGED = "loop", "generate()", "generate() then the loop", "unchanged"


@dataclass(frozen=True)
class Served:
    """How one ``generate()`` call was served, once it ran (``SpeculativeWhisper._serve``), and
    its seconds, each in exactly one place.

    Attributes:
        way: ``LOOP``; ``GENERATE`` (the router chose it, or the loop was busy or not ready);
            ``CONTINUED`` (``generate()`` stopped a decode that outgrew its audio and the loop
            finished it); ``UNCHANGED`` (a call the loop does not implement, ``Route.ineligible``).
        generate_seconds: in CTranslate2's ``generate()``.
        loop_seconds: in the loop.
    """

    way: str
    generate_seconds: float = 0.0
    loop_seconds: float = 0.0

    @property
    def seconds(self) -> float:
        return self.generate_seconds + self.loop_seconds


class CallRoutes:
    """The ``CallRouter``s of one model: one for greedy calls (``greedy``, the caller's if
    given), one per sampling temperature and top-k (how often the target agrees with a draft
    depends on them), and the re-decodes' by the length of their previous hypothesis
    (``redecodes``)."""

    def __init__(self, greedy: Optional[CallRouter] = None) -> None:
        self.greedy = greedy or CallRouter()
        self.sampling: Dict[Tuple[float, int], CallRouter] = {}
        self.redecodes = RedecodeRouters()
        self._setup_paid = False

    def mark_setup_paid(self) -> None:
        """The loop's one-time setup is done: the greedy and sampling routers' first probes
        need not wait for ``generate()`` seconds any more (``FIRST_PROBE_SECONDS``)."""
        self._setup_paid = True
        for router in (self.greedy, *self.sampling.values()):
            router.setup_paid = True

    def router_for(self, options: DecodingOptions, previous: Optional[Sequence[int]] = None) -> CallRouter:
        """The router that decides a call decoded with ``options`` (a re-decode's by the length
        of its ``previous`` hypothesis)."""
        if previous is not None:
            return self.redecodes.router(len(previous))
        if not options.sampling:
            return self.greedy
        key = (options.sampling_temperature, options.sampling_topk)
        return self.sampling.setdefault(key, CallRouter(setup_paid=self._setup_paid))

    def route(
        self,
        prompts,
        options: Mapping[str, Any],
        standing: Optional[str],
        recall: Callable[[], Optional[Sequence[int]]],
        ask_router: bool,
        seeded: bool,
    ) -> Route:
        """The route of ``generate(features, prompts, **options)``, but for its engine outside
        the loop (``SpeculativeWhisper.route`` adds that).

        Args:
            standing: the model's reason the loop may not run any call (``inexact_reason``, a
                drafter that could not be opened), or None.
            recall: the window's previous hypothesis (asked for greedy calls only).
            ask_router: whether the router decides (``Adaptive.route_calls``); if not, every
                eligible call goes to the loop.
            seeded: whether the model samples with a seed: its sampling calls run in the loop
                only (which way a call goes depends on timings, and the loop's draws do not;
                CTranslate2's would differ).
        """
        reason = standing or ineligible_reason(prompts, options)
        if reason is not None:
            return Route(ineligible=reason)
        checked = decoding_options(options)
        previous = None if checked.sampling else recall()
        router = self.router_for(checked, previous)
        wait = checked.sampling and seeded
        loop = router.use_loop(len(prompts)) if ask_router and not wait else True
        return Route(
            options=checked, previous=None if previous is None else tuple(previous), router=router, loop=loop, wait=wait
        )


@dataclass
class EngineRouter:
    """Which engine runs a greedy ``generate()`` outside the loop whose encoder output is in
    the stock worker: the worker (what faster-whisper users run) or the patched runtime, on a
    copy of the encoding. The two engines' greedy decoders differ in speed by CPU, compute type
    and allocator, not in tokens (``bench/studies/fork_generate.py`` measures that).

    By default (``measure=False``) every such call stays in the worker: it holds the encoding
    and runs under the tuned allocator (``stock/allocator.py``), which the patched runtime in
    the caller's process cannot have, and measuring the two engines on different windows
    chose the slower one often enough to make long float32 recordings slower than tuned stock
    (the figures: docs/measurements.md, "Against tuned stock"). ``measure=True`` measures and probes
    both with ``timing``, a ``CallRouter`` with the patched runtime in the loop's place.
    """

    # Measuring is an opt-in that wants both engines timed: the first probe does not wait for
    # seconds of generate() (``FIRST_PROBE_SECONDS``), only for its calls.
    timing: CallRouter = field(default_factory=lambda: CallRouter(first_probe_seconds=0.0))
    measure: bool = False

    def use_patched(self, batch_size: int) -> bool:
        """Whether the next greedy call with ``batch_size`` rows should run on the patched runtime."""
        return self.measure and self.timing.use_loop(batch_size)

    def record(self, patched: bool, batch_size: int, seconds: float, tokens: int) -> None:
        """Fold one call into the running costs (as ``CallRouter.record``)."""
        self.timing.record(patched, batch_size, seconds, tokens)

    @property
    def patched_cost(self) -> Optional[float]:
        """Running seconds per token on the patched runtime, None before one."""
        return self.timing.speculative_cost

    @property
    def stock_cost(self) -> Dict[int, float]:
        """Batch size -> running seconds per token in the worker."""
        return self.timing.generate_cost
