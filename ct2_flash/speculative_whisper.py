"""The runtime proxy faster-whisper calls: ``SpeculativeWhisper``.

faster-whisper routes every model call through ``WhisperModel.model`` (encode, generate,
detect_language, align). ``FlashWhisperModel`` (``whisper_model.py``) puts a
``SpeculativeWhisper`` there, which forwards everything to the engines except ``generate()``
calls with ``beam_size=1``, whose rows it decodes with the speculative loop where the policy
says that pays; this module also decides which calls can never run in the loop, and why.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ct2_flash.audio import check_features
from ct2_flash.drafting.base import DecodingOptions, Drafter, audio_frames, draws_at_random
from ct2_flash.drafting.files import CheckpointError
from ct2_flash.drafting.hypothesis import HypothesisDrafter
from ct2_flash.engines import Engines
from ct2_flash.redecodes import Fingerprint, RecentWindows, remembered_tokens, window_fingerprint
from ct2_flash.routing import CallRouter, RedecodeRouters, produced_tokens
from ct2_flash.runtime.clock import Stopwatch
from ct2_flash.runtime.decoding import SpeculativeDecoder
from ct2_flash.runtime.stats import SpecStats
from ct2_flash.runtime.target import PromptLayout, host_array, on_device_of

logger = logging.getLogger("ct2_flash")

# generate() options whose defaults make a call plain greedy decoding (CTranslate2 defaults
# beam_size to 5, so it must be given explicitly).
_GREEDY_DEFAULTS: Dict[str, Any] = {
    "asynchronous": False,
    "repetition_penalty": 1,
    "no_repeat_ngram_size": 0,
    "return_logits_vocab": False,
}
_BEAM_SEARCH = "beam search is not speculative"
_UNOPENED_DRAFTER = "the drafter could not be opened"
# The compute type at which a multi-token pass computes what single steps compute (to ~1e-5
# logits, far under any real decision's margin); elsewhere the loop runs only with near_exact.
EXACT_COMPUTE_TYPE = "float32"


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
    return f"at {compute_type} a multi-token pass is not the computation generate() makes, so the loop would not be exact"


# The most tokens a greedy decode of a window with this much audio makes when it does not
# repeat itself: a margin for the prompt's echo and the timestamps, and twice the fastest speech
# measured. Past it, ``generate()`` is stopped and the loop finishes the window. (The figures
# behind this constant and the next: docs/measurements.md, "Figures behind the code's constants".)
PLAUSIBLE_BASE_TOKENS = 32
PLAUSIBLE_TOKENS_PER_SECOND = 6
ENCODER_FRAMES_PER_SECOND = 50
# A call is stopped only where the budget leaves at least 1/LEFT_PER_CAPPED of the cap to
# decode after it: the loop verifies the tokens so far again, which a full window's last few
# tokens do not repay.
LEFT_PER_CAPPED = 4


def longest_plausible(audio_frames: int) -> int:
    """The cap of ``SpeculativeWhisper._generate_or_continue`` for a window whose audio fills
    ``audio_frames`` encoder frames."""
    return PLAUSIBLE_BASE_TOKENS + (PLAUSIBLE_TOKENS_PER_SECOND * audio_frames) // ENCODER_FRAMES_PER_SECOND


_BEAM_SEARCH_HINT = " (pass beam_size=1 to transcribe() for speculative greedy decoding)"
_INEXACT_HINT = (" (compute_type='float32' runs the exact loop; near_exact=True runs this one anyway, identical on "
                 "most windows but not all: docs/exactness.md)")
_DEVICE_HINT = " (near_exact=True runs the loop anyway: docs/usage.md, \"On a GPU\")"
_OPTION_NAMES = ("max_length", "suppress_blank", "max_initial_timestamp_index", "length_penalty",
                 "sampling_topk", "sampling_temperature", "num_hypotheses")


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
        frames: per row, the encoder frames that hold audio (``drafting.base.audio_frames``);
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

    ``policy`` decides per greedy call (when the decoder is adaptive) whether the rows go
    through the speculative loop or to the wrapped model's own ``generate()``; sampled calls
    have a policy per temperature (``policy_for``), since how often the target agrees with a
    draft depends on it. Every attribute not defined here is the wrapped model's.

    Thread safety: faster-whisper's ``num_workers`` lets several threads call ``generate()`` on
    one model. The loop holds one drafter's per-window caches and one decoder, so one call at a
    time runs in it; a call that finds it busy goes to CTranslate2's ``generate()`` (the same
    tokens under greedy decoding; under sampling the same distribution, though a seeded model
    waits for the loop instead, to keep its draws) rather than wait. Counters are updated
    under a lock.
    """

    def __init__(self, model, decoder: SpeculativeDecoder, vocabulary: Sequence[str],
                 policy: Optional[CallRouter] = None, near_exact: bool = False,
                 engines: Optional[Engines] = None, redecodes: bool = True) -> None:
        self._model = model
        self.decoder = decoder
        # Where encoder outputs and the calls outside the loop run (stock engine or patched).
        self.engines = engines or Engines(model)
        # Where the loop's passes are not single steps' computation, only an opt-in runs it.
        self._device = getattr(decoder.runtime.model, "device", "cpu")  # "cpu" or "cuda", fixed with the model
        self.inexact_reason = inexact_reason(decoder.runtime.model.compute_type, near_exact, self._device)
        self.policy = policy or CallRouter()
        self._sampling_policies: Dict[Tuple[float, int], CallRouter] = {}
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
        self.redecode_routers = RedecodeRouters()
        self._loop = threading.Lock()  # held by the one call in the speculative loop
        self._counting = threading.Lock()  # counters and policies touched outside the loop

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

    def policy_for(self, options: DecodingOptions) -> CallRouter:
        """The policy that decides calls decoded with ``options`` (one per temperature and top-k)."""
        if not options.sampling:
            return self.policy
        key = (options.sampling_temperature, options.sampling_topk)
        return self._sampling_policies.setdefault(key, CallRouter())

    def generate(self, features, prompts, **kwargs):
        """CTranslate2's ``Whisper.generate``; calls with ``beam_size=1`` run speculatively,
        row by row and hypothesis by hypothesis."""
        reason = self._fallback_reason(prompts, kwargs)
        if reason is not None:
            if reason not in self._fallback_reasons_logged:
                self._fallback_reasons_logged.add(reason)
                # A user who only swapped the class (faster-whisper's transcribe() defaults to
                # beam_size=5) or runs on a GPU gets no speculation at all: warn, and say how.
                # int8 on the CPU is the usual faster-whisper setting, exact and faster as it is
                # (the worker's encoder), and float32 would be slower there: INFO, with the options.
                if reason == _BEAM_SEARCH:
                    log, hint = logger.warning, self.beam_search_hint
                elif reason == self.inexact_reason and self._device != "cpu":
                    log, hint = logger.warning, _DEVICE_HINT
                elif reason == self.inexact_reason:
                    log, hint = logger.info, _INEXACT_HINT
                else:
                    log, hint = logger.info, ""
                log("ct2-flash: %s; using CTranslate2's own generate() for such calls%s", reason, hint)
            with self._counting:
                self.stats.fallback_calls += 1
            return self.engines.generate(self._window(features).output, prompts, **kwargs)

        options = DecodingOptions(  # bad options raise here, before anything is decoded
            suppress_tokens=tuple(int(t) for t in kwargs.get("suppress_tokens", (-1,))),
            **{name: kwargs[name] for name in _OPTION_NAMES if name in kwargs},
        )
        window = self._window(features)
        # A greedy call on one window that this thread decoded before: its previous hypothesis.
        fingerprint = None if options.sampling else window.fingerprint
        previous = None if fingerprint is None else self.recent.recall(fingerprint)
        # Without adaptive (and while tests swap drafters in) every call drafts.
        with self._counting:
            self.stats.redecodes += int(previous is not None)
            policy = self.redecode_routers.router(len(previous)) if previous is not None else self.policy_for(options)
            # A seeded model samples in the loop only: which way a call goes depends on
            # timings, and the loop's draws do not (CTranslate2's would differ).
            repeatable = options.sampling and self.decoder.seeded
            speculative = policy.speculate(len(prompts)) if self.decoder.adaptive.route_calls and not repeatable else True
        # Another thread in the loop: this call takes CTranslate2's way rather than wait.
        held = in_loop = speculative and self._loop.acquire(blocking=repeatable)
        try:
            if in_loop:
                in_loop = speculative = self._loop_ready()
            with Stopwatch() as watch:
                if in_loop:
                    results = self._speculative_rows(window, prompts, options, kwargs, previous)
                else:  # speculation measured slower (or is busy): the very call faster-whisper makes
                    results = self._generate_or_continue(window, prompts, options, kwargs, busy=speculative)
        finally:
            if held:
                self._loop.release()
        tokens = produced_tokens(results)
        with self._counting:
            if not in_loop:
                self.stats.generate_rows += len(prompts)
                self.stats.generate_seconds += watch.seconds
                self.stats.busy_calls += int(speculative)
            policy.record(in_loop, len(prompts), watch.seconds, tokens)
        if fingerprint is not None:  # whichever way it went, the next re-decode drafts from it
            layout = PromptLayout.of(prompts[0], self.decoder.runtime.special)
            decoded = results[0].sequences_ids[0]
            self.recent.remember(fingerprint, remembered_tokens(
                decoded, len(decoded) < layout.max_steps(options.max_length), self.decoder.runtime.special.eot))
        return results

    def _generate_or_continue(self, window: EncodedWindow, prompts, options: DecodingOptions,
                              kwargs: Dict[str, Any], busy: bool) -> list:
        """``generate()``, stopped where a one-row greedy decode outgrows its audio
        (``longest_plausible``) and finished in the loop, which offers the tokens so far and
        then the decode's own repeats (``HypothesisDrafter``).

        A decode that outgrows its audio is nearly always Whisper repeating itself to the length
        limit on a window with little or no audio (the window after a seek, a buffer's last
        second), which ``generate()`` decodes token by token and the loop in blocks. The tokens
        are the same either way: a greedy decode stopped early is the first tokens of the whole
        one, and the loop decodes the window afresh, verifying them. Where the loop cannot take
        it (busy, or a model it does not run), the whole call goes to ``generate()`` again.
        """
        capped = None if busy else self._continuation_cap(window, prompts, options)
        if capped is None:
            return self.engines.generate(window.output, prompts, **kwargs)
        cap, max_length = capped
        results = self.engines.generate(window.output, prompts, **dict(kwargs, max_length=max_length))
        decoded = results[0].sequences_ids[0]
        if len(decoded) < cap:  # it ended: the whole call's result
            return results
        if not self._loop.acquire(blocking=False):
            return self.engines.generate(window.output, prompts, **kwargs)
        try:
            if not self._loop_ready():
                return self.engines.generate(window.output, prompts, **kwargs)
            with self._counting:
                self.stats.continued_rows += 1
            return self._speculative_rows(window, prompts, options, kwargs, tuple(decoded))
        finally:
            self._loop.release()

    def _continuation_cap(self, window: EncodedWindow, prompts, options: DecodingOptions) -> Optional[Tuple[int, int]]:
        """(tokens after which ``_generate_or_continue`` hands a call to the loop, the
        ``max_length`` that stops ``generate()`` there), or None where it does not (several rows,
        sampling, unknown audio length, or a cap that would leave less than 1/``LEFT_PER_CAPPED``
        of itself of the call's budget). Calls the loop cannot run never get here
        (``_fallback_reason``)."""
        if len(prompts) != 1 or options.sampling or not window.frames:
            return None
        cap = longest_plausible(window.frames[0])
        layout = PromptLayout.of(prompts[0], self.decoder.runtime.special)
        left = layout.max_steps(options.max_length) - cap
        return (cap, layout.max_length_for(cap)) if left * LEFT_PER_CAPPED >= cap else None

    def _loop_ready(self) -> bool:
        """Whether the loop can take the call whose thread holds the loop lock: a model deferred
        until its first use loads here (not in the call a router times), and the drafter opens
        (``_drafter_opens``)."""
        self.decoder.runtime.prepare(recovery=self.decoder.drafter.needs_states)
        return self._drafter_opens()

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
            self._fallback_reasons_logged.add(_UNOPENED_DRAFTER)
            logger.warning("ct2-flash: %s (%s); using CTranslate2's own generate() for every call from now on "
                           "(the same tokens, without speculation)", _UNOPENED_DRAFTER, error)
            return False

    def detect_language(self, features, *args, **kwargs):
        return self.engines.detect_language(EncodedWindow.of(features).output, *args, **kwargs)

    def align(self, features, start_sequence, text_tokens, num_frames, median_filter_width: int = 7):
        return self.engines.align(EncodedWindow.of(features).output, start_sequence, text_tokens, num_frames,
                                  median_filter_width)

    def _speculative_rows(self, window: EncodedWindow, prompts, options: DecodingOptions, kwargs: Dict[str, Any],
                          previous: Optional[Sequence[int]] = None) -> list:
        """The rows of a call decoded in the loop, by a ``HypothesisDrafter`` around the model's
        drafter: it offers ``previous`` (the previous hypothesis of a one-row call's window, or
        the tokens ``generate()`` made before it stopped), and each row's own repeats."""
        if not isinstance(self.decoder.drafter, HypothesisDrafter):
            drafter = HypothesisDrafter(self.decoder.drafter, self.decoder.runtime.special.timestamp_begin)
            drafter.remember(previous)
            with self.decoder.use_drafter(drafter, self.decoder.adaptive):
                return self._speculative_rows(window, prompts, options, kwargs)
        frames = window.frames
        encoder_output = self.engines.local(window.output)  # the worker's copy, if it encoded
        rows = host_array(encoder_output) if len(prompts) > 1 else None
        results = []
        for index, prompt in enumerate(prompts):
            # Rows (and hypotheses) run one at a time: the patched decoder state has batch size 1.
            row = encoder_output if rows is None else on_device_of(rows[index : index + 1], encoder_output)
            if index == 0 and self._model.compute_type == EXACT_COMPUTE_TYPE and self._device == "cpu":
                self.decoder.confirm_score_isa(row, prompt)  # once per process
            decoded = [self.decoder.decode(row, prompt, options, audio_frames=None if frames is None else frames[index])
                       for _ in range(options.num_hypotheses)]
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

    def _fallback_reason(self, prompts, kwargs: Dict[str, Any]) -> Optional[str]:
        if kwargs.get("beam_size", 5) != 1:
            return _BEAM_SEARCH
        if self.inexact_reason is not None:
            return self.inexact_reason
        if self._unopened_drafter is not None and self._unopened_drafter is self.decoder.drafter:
            return _UNOPENED_DRAFTER
        sampling = draws_at_random(kwargs.get("sampling_topk", 1), kwargs.get("sampling_temperature", 1.0))
        if kwargs.get("num_hypotheses", 1) > 1 and not sampling:  # CTranslate2 decides (patience)
            return "several hypotheses without sampling are not speculative"
        for name, default in _GREEDY_DEFAULTS.items():
            if kwargs.get(name, default) != default:
                return f"generate(..., {name}={kwargs[name]!r}) is not speculative"
        unknown = set(kwargs) - set(_GREEDY_DEFAULTS) - set(_OPTION_NAMES) - {
            "beam_size", "patience", "suppress_tokens", "return_scores", "return_no_speech_prob",
        }
        if unknown:
            return f"generate() options {sorted(unknown)} are not speculative"
        if any(not isinstance(t, (int, np.integer)) for prompt in prompts for t in prompt):
            return "prompts given as token strings are not speculative"
        return None
