"""The runtime proxy faster-whisper calls: ``SpeculativeWhisper``.

faster-whisper routes every model call through ``WhisperModel.model`` (encode, generate,
detect_language, align). ``FlashWhisperModel`` (``whisper_model.py``) puts a
``SpeculativeWhisper`` there, which forwards everything to the engines except ``generate()``
calls with ``beam_size=1``, whose rows it decodes with the speculative loop where that pays.
Each call's ``Route`` (``routing.py``: whether the loop may run it and why not, whether it pays,
which engine serves it outside the loop) is made once, by ``SpeculativeWhisper.route``; how
it was served once it ran (``routing.Served``: the loop, ``generate()``, ``generate()`` then the
loop, or unchanged, with its seconds) comes back from ``_serve`` with the results and is booked
once, by ``_book``. Where the loop never runs (int8 without ``near_exact``, a GPU) every call is
unchanged, and the stock worker may batch it with other threads' calls (``stock/batching.py``).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ct2_flash.adapter.audio import audio_frames, check_features
from ct2_flash.adapter.engine_pair import Engines
from ct2_flash.adapter.routing import (
    BEAM_SEARCH,
    CONTINUED,
    EXACT_COMPUTE_TYPE,
    GENERATE,
    LOOP,
    UNCHANGED,
    UNOPENED_DRAFTER,
    CallRouter,
    CallRoutes,
    Route,
    Served,
    inexact_reason,
    produced_tokens,
)
from ct2_flash.drafting.base import Drafter
from ct2_flash.drafting.files import CheckpointError
from ct2_flash.drafting.hypothesis import HypothesisDrafter, ends_in_loop
from ct2_flash.loop.clock import Stopwatch
from ct2_flash.loop.decoding import SpeculativeDecoder
from ct2_flash.loop.options import DecodingOptions
from ct2_flash.loop.stats import SpecStats
from ct2_flash.loop.target import PromptLayout, host_array, on_device_of
from ct2_flash.redecodes.memory import Fingerprint, RecentWindows, remembered_tokens, window_fingerprint

logger = logging.getLogger("ct2_flash")

# The most tokens a greedy decode of a window with this much audio makes when it does not
# repeat itself: the densest decode measured, with a margin. Past it, ``generate()`` is stopped
# and the loop finishes the window; a dense window stopped there costs one re-verification of
# its tokens, a looping one is spared the rest of its loop. (The figures behind this constant
# and the next: docs/measurements.md, "Figures behind the code's constants".)
PLAUSIBLE_BASE_TOKENS = 32
PLAUSIBLE_TOKENS_PER_SECOND = 4
ENCODER_FRAMES_PER_SECOND = 50
# A call is stopped only where the budget leaves at least 1/LEFT_PER_CAPPED of the cap to
# decode after it: the loop verifies the tokens so far again, which a full window's last few
# tokens do not repay.
LEFT_PER_CAPPED = 4
# Where the prompt's text ends in a loop (``hypothesis.ends_in_loop``: the window before
# repeated itself, and faster-whisper passes that on), ``generate()`` is stopped after this many
# tokens whatever the audio: such a window mostly repeats the loop to the length limit, which the
# loop offers from its repeats once they show; one that does not pays the loop for the rest.
LOOPED_PROMPT_CAP = 8


def longest_plausible(audio_frames: int) -> int:
    """The cap of ``SpeculativeWhisper._generate_or_continue`` for a window whose audio fills
    ``audio_frames`` encoder frames."""
    return PLAUSIBLE_BASE_TOKENS + (PLAUSIBLE_TOKENS_PER_SECOND * audio_frames) // ENCODER_FRAMES_PER_SECOND


def ran_to_limit(results, budgets: Sequence[int]) -> bool:
    """Whether a hypothesis of a call ran to its length limit (``budgets``: per row, the
    tokens CTranslate2 may produce, ``PromptLayout.max_steps``): nearly always Whisper
    repeating itself, which the loop decodes in blocks of 32 and ``generate()`` token by token.
    Such a call does not teach its router: its cost per token says nothing of the next
    window's, and one looping window made the loop look cheap enough to take the normal
    windows after it, where it is slower (docs/measurements.md, "A long recording's loops")."""
    return any(len(ids) >= budget for result, budget in zip(results, budgets) for ids in result.sequences_ids)


_BEAM_SEARCH_HINT = " (pass beam_size=1 to transcribe() for speculative greedy decoding)"
_INEXACT_HINT = (
    " (compute_type='float32' runs the exact loop; near_exact=True runs this one anyway, identical on "
    "most windows but not all: docs/exactness.md)"
)
_DEVICE_HINT = ' (near_exact=True runs the loop anyway: docs/usage.md, "On a GPU")'


@dataclass(eq=False)
class EncodedWindow:
    """An encoder output as ``SpeculativeWhisper.encode`` returns it: the engine's output with
    what is known of the audio it encoded, made once and handed back with it. faster-whisper
    only ever passes an encoder output back to the model (``generate``, ``align``,
    ``detect_language``), so the loop, the routers and the re-decode memory find the window's
    audio length and fingerprint on the value itself. Other attributes are the output's, so a
    caller that reads one (``shape``, ``device``) sees what CTranslate2 would give.

    Attributes:
        output: the engine's encoder output: a ``RemoteEncoding`` (the worker's) or a StorageView.
        frames: per row, the encoder frames that hold audio (``audio.audio_frames``);
            None where not known (an output encoded elsewhere, features not on the host).
        fingerprint: the first second of a one-row window's features
            (``redecodes.window_fingerprint``); None for several rows, re-decodes off, or an
            output encoded elsewhere.
    """

    output: Any
    frames: Optional[List[int]] = None
    fingerprint: Optional[Fingerprint] = None

    @classmethod
    def of(cls, encoder_output) -> "EncodedWindow":
        """``encoder_output`` as a window: itself, or one encoded elsewhere (a caller's own
        ``encode()`` on another model) of which nothing is known."""
        return encoder_output if isinstance(encoder_output, cls) else cls(encoder_output)

    def __getattr__(self, name: str):
        if name == "output":  # not set yet (copying): no recursion
            raise AttributeError(name)
        return getattr(self.output, name)


@dataclass
class FlashGenerationResult:
    """Stands in for ``ctranslate2.models.WhisperGenerationResult`` (one hypothesis)."""

    sequences: List[List[str]]
    sequences_ids: List[List[int]]
    scores: List[float] = field(default_factory=list)
    no_speech_prob: float = 0.0


class SpeculativeWhisper:
    """A ``ctranslate2.models.Whisper`` whose ``generate()`` with ``beam_size=1`` (greedy or
    sampling) may run speculatively.

    Each call's ``Route`` (``route``) says whether its rows go through the speculative loop or
    to ``generate()`` on one of the engines: ``routes`` holds the routers that decide (when the
    decoder is adaptive), ``call_router`` deciding greedy calls. Every attribute not defined
    here is the wrapped model's.

    Thread safety: faster-whisper's ``num_workers`` lets several threads call ``generate()`` on
    one model. The loop holds one drafter's per-window caches and one decoder, so one call at a
    time runs in it; a call that finds it busy goes to CTranslate2's ``generate()`` (the same
    tokens under greedy decoding; under sampling the same distribution, though a seeded model
    waits for the loop instead, to keep its draws) rather than wait. Counters are updated
    under a lock.
    """

    def __init__(
        self,
        model,
        decoder: SpeculativeDecoder,
        vocabulary: Sequence[str],
        call_router: Optional[CallRouter] = None,
        near_exact: bool = False,
        engines: Optional[Engines] = None,
        redecodes: bool = True,
    ) -> None:
        self._model = model
        self.decoder = decoder
        # Where encoder outputs and the calls outside the loop run (stock engine or patched).
        self.engines = engines or Engines(model)
        # Where the loop's passes are not single steps' computation, only an opt-in runs it.
        self._device = getattr(decoder.runtime.model, "device", "cpu")  # "cpu" or "cuda", fixed with the model
        self.inexact_reason = inexact_reason(decoder.runtime.model.compute_type, near_exact, self._device)
        self.routes = CallRoutes(call_router)
        self._vocabulary = vocabulary
        self._fallback_reasons_logged: set = set()
        # A drafter ONNX Runtime could not open (``_drafter_opens``): while it is the decoder's,
        # every call goes to ``generate()``.
        self._unopened_drafter: Optional[Drafter] = None
        # What the one beam-search warning tells the user to do (``dropin`` names the client's option).
        self.beam_search_hint = _BEAM_SEARCH_HINT
        # Per thread, the last windows decoded greedily: a re-decode of the same audio (a
        # streaming client's growing buffer) is offered its previous hypothesis, and routed by
        # the length of that hypothesis (routing.RedecodeRouters), since how well the loop
        # pays follows how much of the buffer it covers.
        self.recent = RecentWindows() if redecodes else None
        self._loop = threading.Lock()  # held by the one call in the speculative loop
        self._counting = threading.Lock()  # counters and routers touched outside the loop

    def __getattr__(self, name: str):
        return getattr(self._model, name)

    @property
    def stats(self) -> SpecStats:
        return self.decoder.stats

    def encode(self, features, to_cpu: bool = False) -> EncodedWindow:
        check_features(features)
        with Stopwatch() as watch:
            output = self.engines.encode(features, to_cpu=to_cpu)
        with self._counting:
            self.stats.encoder_seconds += watch.seconds
        fingerprint = window_fingerprint(features) if self.recent is not None else None
        return EncodedWindow(output, audio_frames(features), fingerprint)

    @property
    def call_router(self) -> CallRouter:
        """The router of greedy calls that are not re-decodes."""
        return self.routes.greedy

    @property
    def redecode_routers(self):
        """The re-decodes' routers, by the length of the previous hypothesis."""
        return self.routes.redecodes

    def route(self, window: EncodedWindow, prompts, kwargs: Dict[str, Any]) -> Route:
        """How ``generate(window, prompts, **kwargs)`` is served: made once per call, from the
        model's standing reasons, the call's options, the window's previous hypothesis, the
        router that decides and, outside the loop, the engine (``routing.Route``). Bad options
        raise here, before anything is decoded."""
        standing = self.inexact_reason
        if standing is None and self._unopened_drafter is not None and self._unopened_drafter is self.decoder.drafter:
            standing = UNOPENED_DRAFTER
        # A window encoded while re-decodes were remembered is not looked up once they are not.
        fingerprint = window.fingerprint if self.recent is not None else None
        with self._counting:
            route = self.routes.route(
                prompts,
                kwargs,
                standing,
                recall=lambda: None if fingerprint is None else self.recent.recall(fingerprint),
                ask_router=self.decoder.adaptive.route_calls,
                seeded=self.decoder.seeded,
            )
        if route.loop:
            return route
        return replace(route, engine=self.engines.engine_for(window.output, kwargs, len(prompts)))

    def generate(self, features, prompts, **kwargs):
        """CTranslate2's ``Whisper.generate``; calls with ``beam_size=1`` run speculatively,
        row by row and hypothesis by hypothesis, where their ``route`` says so."""
        window = self._window(features)
        route = self.route(window, prompts, kwargs)
        results, served = self._serve(window, prompts, route, kwargs)
        self._book(window, prompts, route, results, served)
        return results

    def _serve(self, window: EncodedWindow, prompts, route: Route, kwargs: Dict[str, Any]) -> Tuple[list, Served]:
        """Run the call the way its ``route`` says, or the way left where the loop is busy or not
        ready; its results, and how it was served (``Served``)."""
        if route.ineligible is not None:
            self._log_ineligible(route.ineligible)
            with Stopwatch() as watch:
                results = self.engines.generate(window.output, prompts, engine=route.engine, **kwargs)
            return results, Served(UNCHANGED, generate_seconds=watch.seconds)
        # Another thread in the loop: this call takes CTranslate2's way rather than wait.
        if route.loop:
            looped = self._in_loop(
                lambda: self._speculative_rows(window, prompts, route.options, kwargs, route.previous), route.wait
            )
            if looped is not None:
                return looped[0], Served(LOOP, loop_seconds=looped[1])
        # Speculation measured slower (or is busy): the very call faster-whisper makes.
        return self._generate_or_continue(window, prompts, route, kwargs)

    def _in_loop(self, decode: Callable[[], list], wait: bool) -> Optional[Tuple[list, float]]:
        """(``decode()``'s results, its seconds), run while this call holds the loop; None where
        another thread holds it (unless ``wait``) or the loop is not ready."""
        if not self._loop.acquire(blocking=wait):
            return None
        try:
            if not self._loop_ready():
                return None
            with Stopwatch() as watch:
                results = decode()
            return results, watch.seconds
        finally:
            self._loop.release()

    def _book(self, window: EncodedWindow, prompts, route: Route, results: list, served: Served) -> None:
        """Count a call once, where it ran: its rows and seconds in ``stats``; its cost for its
        router where it ran one way only and stopped short of its length limit; its tokens for
        the next re-decode of its window."""
        if served.way == UNCHANGED:
            with self._counting:
                self.stats.unchanged_calls += 1
            return
        options = route.options
        special = self.decoder.runtime.special
        budgets = [PromptLayout.of(prompt, special).max_steps(options.max_length) for prompt in prompts]
        with self._counting:
            self.stats.redecodes += int(route.previous is not None)
            if served.way != LOOP:
                self.stats.rows_in_generate += len(prompts)
                self.stats.generate_seconds += served.generate_seconds  # a continuation's loop part is the loop's
                self.stats.busy_calls += int(route.loop)
            if served.way != CONTINUED and not ran_to_limit(results, budgets):
                route.router.record(served.way == LOOP, len(prompts), served.seconds, produced_tokens(results))
        fingerprint = None if options.sampling or self.recent is None else window.fingerprint
        if fingerprint is not None:  # whichever way it went, the next re-decode drafts from it
            decoded = results[0].sequences_ids[0]
            self.recent.remember(fingerprint, remembered_tokens(decoded, len(decoded) < budgets[0], special.eot))

    def _log_ineligible(self, reason: str) -> None:
        """Say once per reason why calls go to ``generate()`` without the loop."""
        if reason in self._fallback_reasons_logged:
            return
        self._fallback_reasons_logged.add(reason)
        # A user who only swapped the class (faster-whisper's transcribe() defaults to
        # beam_size=5) or runs on a GPU gets no speculation at all: warn, and say how.
        # int8 on the CPU is the usual faster-whisper setting, exact and faster as it is
        # (the worker's encoder), and float32 would be slower there: INFO, with the options.
        if reason == BEAM_SEARCH:
            log, hint = logger.warning, self.beam_search_hint
        elif reason == self.inexact_reason and self._device != "cpu":
            log, hint = logger.warning, _DEVICE_HINT
        elif reason == self.inexact_reason:
            log, hint = logger.info, _INEXACT_HINT
        else:
            log, hint = logger.info, ""
        log("ct2-flash: %s; using CTranslate2's own generate() for such calls%s", reason, hint)

    def _generate_or_continue(
        self, window: EncodedWindow, prompts, route: Route, kwargs: Dict[str, Any]
    ) -> Tuple[list, Served]:
        """(the call's results, how it was served: ``GENERATE`` or ``CONTINUED``): ``generate()``, stopped where a one-row greedy decode outgrows its audio
        (``longest_plausible``) or, after a prompt that ends in a loop, early
        (``LOOPED_PROMPT_CAP``), and finished in the loop, which offers the tokens so far and
        then the decode's own repeats (``HypothesisDrafter``).

        A decode that outgrows its audio is nearly always Whisper repeating itself to the length
        limit: on a window with little or no audio (the window after a seek, a buffer's last
        second), or on a long recording's window given the previous window's loop as its
        prompt. ``generate()`` decodes it token by token, the loop in blocks. The tokens
        are the same either way: a greedy decode stopped early is the first tokens of the whole
        one, and the loop decodes the window afresh, verifying them. Where the loop cannot take
        it (busy, or a model it does not run), the whole call goes to ``generate()`` again.
        """
        # A call routed to the loop that found it busy: its engine is chosen now.
        engine = route.engine or self.engines.engine_for(window.output, kwargs, len(prompts))
        capped = None if route.loop else self._continuation_cap(window, prompts, route.options)
        with Stopwatch() as watch:
            limited = kwargs if capped is None else dict(kwargs, max_length=capped[1])
            results = self.engines.generate(window.output, prompts, engine=engine, **limited)
        if capped is None or len(results[0].sequences_ids[0]) < capped[0]:  # it ended: the whole call's result
            return results, Served(GENERATE, generate_seconds=watch.seconds)
        decoded = tuple(results[0].sequences_ids[0])
        looped = self._in_loop(lambda: self._speculative_rows(window, prompts, route.options, kwargs, decoded), False)
        if looped is not None:
            with self._counting:
                self.stats.continued_rows += 1
            return looped[0], Served(CONTINUED, generate_seconds=watch.seconds, loop_seconds=looped[1])
        with Stopwatch() as again:  # the loop cannot take it: the whole call in generate()
            results = self.engines.generate(window.output, prompts, engine=engine, **kwargs)
        return results, Served(GENERATE, generate_seconds=watch.seconds + again.seconds)

    def _continuation_cap(self, window: EncodedWindow, prompts, options: DecodingOptions) -> Optional[Tuple[int, int]]:
        """(tokens after which ``_generate_or_continue`` hands a call to the loop, the
        ``max_length`` that stops ``generate()`` there), or None where it does not (several rows,
        sampling, unknown audio length, or a cap that would leave less than 1/``LEFT_PER_CAPPED``
        of itself of the call's budget). The cap is ``longest_plausible`` for the window's audio,
        or ``LOOPED_PROMPT_CAP`` where the prompt's text ends in a loop (``ends_in_loop``).
        Calls the loop cannot run never get here (``Route.ineligible``)."""
        if len(prompts) != 1 or options.sampling or not window.frames:
            return None
        cap = longest_plausible(window.frames[0])
        special = self.decoder.runtime.special
        layout = PromptLayout.of(prompts[0], special)
        if ends_in_loop(prompts[0][: layout.sot_index], special.eot):
            cap = min(cap, LOOPED_PROMPT_CAP)
        left = layout.max_steps(options.max_length) - cap
        return (cap, layout.max_length_for(cap)) if left * LEFT_PER_CAPPED >= cap else None

    def _loop_ready(self) -> bool:
        """Whether the loop can take the call whose thread holds the loop lock: a model deferred
        until its first use loads here (not in the call a router times), and the drafter opens
        (``_drafter_opens``); once it has, the routers know the loop's setup is paid."""
        self.decoder.runtime.prepare(recovery=self.decoder.drafter.needs_states)
        if not self._drafter_opens():
            return False
        with self._counting:
            self.routes.mark_setup_paid()
        return True

    def _drafter_opens(self) -> bool:
        """Open the drafter before the loop's first window (the loop lock is held). One that
        passed its checks at construction and still cannot be opened (a hand-edited export, a
        broken ONNX Runtime) is set aside with one warning, and this call and every later one
        goes to ``generate()``: the same tokens, rather than an error mid-transcription."""
        drafter = self.decoder.drafter
        try:
            drafter.prepare()
            return True
        except CheckpointError as error:
            self._unopened_drafter = drafter
            self._fallback_reasons_logged.add(UNOPENED_DRAFTER)
            logger.warning(
                "ct2-flash: %s (%s); using CTranslate2's own generate() for every call from now on "
                "(the same tokens, without speculation)",
                UNOPENED_DRAFTER,
                error,
            )
            return False

    def detect_language(self, features, *args, **kwargs):
        return self.engines.detect_language(EncodedWindow.of(features).output, *args, **kwargs)

    def align(self, features, start_sequence, text_tokens, num_frames, median_filter_width: int = 7):
        return self.engines.align(
            EncodedWindow.of(features).output, start_sequence, text_tokens, num_frames, median_filter_width
        )

    def _speculative_rows(
        self,
        window: EncodedWindow,
        prompts,
        options: DecodingOptions,
        kwargs: Dict[str, Any],
        previous: Optional[Sequence[int]] = None,
    ) -> list:
        """The rows of a call decoded in the loop, by a ``HypothesisDrafter`` around the model's
        drafter: it offers ``previous`` (the previous hypothesis of a one-row call's window, or
        the tokens ``generate()`` made before it stopped), and each row's own repeats."""
        if isinstance(self.decoder.drafter, HypothesisDrafter):  # a caller's own: it offers as it is
            return self._decoded_rows(window, prompts, options, kwargs)
        special = self.decoder.runtime.special
        drafter = HypothesisDrafter(self.decoder.drafter, special.timestamp_begin, special.eot)
        drafter.remember(previous)
        with self.decoder.use_drafter(drafter, self.decoder.adaptive):
            return self._decoded_rows(window, prompts, options, kwargs)

    def _decoded_rows(self, window: EncodedWindow, prompts, options: DecodingOptions, kwargs: Dict[str, Any]) -> list:
        """The rows of a call, one at a time, by the loop with the drafter it holds now."""
        frames = window.frames
        encoder_output = self.engines.local(window.output)  # the worker's copy, if it encoded
        rows = host_array(encoder_output) if len(prompts) > 1 else None
        results = []
        for index, prompt in enumerate(prompts):
            # Rows (and hypotheses) run one at a time: the patched decoder state has batch size 1.
            row = encoder_output if rows is None else on_device_of(rows[index : index + 1], encoder_output)
            if index == 0 and self._model.compute_type == EXACT_COMPUTE_TYPE and self._device == "cpu":
                self.decoder.confirm_score_isa(row, prompt)  # once per process
            decoded = [
                self.decoder.decode(row, prompt, options, audio_frames=None if frames is None else frames[index])
                for _ in range(options.num_hypotheses)
            ]
            # CTranslate2 returns independent samples best score first (a stable sort).
            decoded.sort(key=lambda result: -result.score)
            results.append(
                FlashGenerationResult(
                    sequences=[[self._vocabulary[t] for t in result.tokens] for result in decoded],
                    sequences_ids=[result.tokens for result in decoded],
                    scores=[result.score for result in decoded] if kwargs.get("return_scores", False) else [],
                    no_speech_prob=decoded[0].no_speech_prob if kwargs.get("return_no_speech_prob", False) else 0.0,
                )
            )
        return results

    def _window(self, features) -> EncodedWindow:
        """The window ``generate()`` was given: ``features`` already encoded, or encoded here."""
        shape = features.shape
        if len(shape) == 3 and shape[1] == self._model.n_mels and shape[2] != shape[1]:
            return self.encode(features)
        return EncodedWindow.of(features)
