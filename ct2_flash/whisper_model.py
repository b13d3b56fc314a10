"""The faster-whisper adapter: ``FlashWhisperModel`` and the runtime proxy behind it.

faster-whisper routes every model call through ``WhisperModel.model`` (encode, generate,
detect_language, align). ``FlashWhisperModel`` replaces that attribute with
``SpeculativeWhisper``, which forwards everything to the CTranslate2 model except greedy
``generate()`` rows, which it decodes with the speculative loop. ``transcribe()`` and
``BatchedInferencePipeline`` are inherited unchanged, so every option they implement (VAD,
word timestamps, prompts, fallback, long audio) behaves as in faster-whisper.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Dict, List, Optional, Sequence, Tuple, Union

import ctranslate2
import faster_whisper
import numpy as np
from faster_whisper import WhisperModel

from ct2_flash.audio import check_features, checked_audio
from ct2_flash.runtime.clock import Stopwatch
from ct2_flash.runtime.decoding import Adaptive, SpeculativeDecoder, checked_draft_count
from ct2_flash.runtime.draft_lengths import DraftLengths
from ct2_flash.drafting.files import SHIPPED_DRAFTERS, CheckpointError, check_adapted
from ct2_flash.drafting.base import Drafter, DecodingOptions, PromptLookupDrafter, audio_frames
from ct2_flash.engine.deferred_model import DeferredWhisper, deferred_compute_type, deferring_loads
from ct2_flash.engine.model_files import CT2ModelFile, ModelFileError
from ct2_flash.engine.models import embedded_name, resolve_model
from ct2_flash.routing import CallRouter, EngineRouter, produced_tokens
from ct2_flash.redecodes import Fingerprint, RecentWindows, remembered_tokens, window_fingerprint
from ct2_flash.drafting.hypothesis import HypothesisDrafter
from ct2_flash.runtime.stats import SpecStats
from ct2_flash.runtime.target import PromptLayout, TargetRuntime, host_array, on_device_of
from ct2_flash.runtime.vocabulary import load_config, load_vocabulary
from ct2_flash.stock.client import StockEngine
from ct2_flash.stock.location import installed as stock_installed
from ct2_flash.engines import Engines
from ct2_flash.thread_split import measure_split

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


_BEAM_SEARCH_HINT = " (pass beam_size=1 to transcribe() for speculative greedy decoding)"
_INEXACT_HINT = (" (compute_type='float32' runs the exact loop; near_exact=True runs this one anyway, identical on "
                 "most windows but not all: docs/exactness.md)")
_DEVICE_HINT = " (near_exact=True runs the loop anyway: docs/usage.md, \"On a GPU\")"
_OPTION_NAMES = ("max_length", "suppress_blank", "max_initial_timestamp_index", "length_penalty",
                 "sampling_topk", "sampling_temperature", "num_hypotheses")

# Default guard margins (logits). float32 rows are within 5e-5 of single steps; at int8 2.0 is
# where identity stops improving (bench/results/earlier/guard_margin/int8.json).
FLOAT32_GUARD = 1e-3
QUANTIZED_GUARD = 2.0
# Re-decodes (``SpeculativeWhisper.redecode_policy``): calls measured in the loop before
# generate() is, and the interval between probes of the loser, whatever their cost. Which way
# wins changes as a buffer grows: the previous hypothesis covers more of it. On the 94 s test
# clip's buffers at float32 (AMD EPYC, tiny.en) the loop's cost per token fell from 2x
# generate()'s at 3 s to 0.65x at 25 s (whole transcribe 0.80 s against 1.10 s), so the loser
# is probed every few calls, and one short first call does not decide alone.
REDECODE_LOOP_FIRST = 3
REDECODE_PROBE_INTERVAL = 4
# decoder_threads="auto" splits off a one-thread decoder for models up to this width.
AUTO_SPLIT_MAX_WIDTH = 512


def signature_of(original) -> Callable:
    """Give the decorated override ``original``'s signature (``inspect.signature``).

    The overrides take ``(self, audio, *args, **kwargs)`` and pass everything on, so that
    faster-whisper's options keep working in every version; clients and servers that build
    their options from the signature (``inspect.signature(model.transcribe)``) see
    faster-whisper's parameters, as without ct2-flash.
    """
    def give(override: Callable) -> Callable:
        override.__signature__ = inspect.signature(original)
        return override
    return give


def constructor_signature(own: Callable, options: Optional[Callable] = None) -> inspect.Signature:
    """What a constructor that takes ``*args, **kwargs`` and passes them on to faster-whisper's
    accepts, in one signature: faster-whisper's parameters (with ``own``'s defaults where it
    names them), then the keyword-only ones of ``options`` (default ``own``: ct2-flash's
    options), then faster-whisper's ``**kwargs``."""
    Parameter = inspect.Parameter
    named = {p.name: p for p in inspect.signature(own).parameters.values() if p.kind is Parameter.POSITIONAL_OR_KEYWORD}
    ours = [p for p in inspect.signature(options or own).parameters.values() if p.kind is Parameter.KEYWORD_ONLY]
    taken = {p.name for p in ours}
    theirs = list(inspect.signature(WhisperModel.__init__).parameters.values())
    head = [p.replace(default=named[p.name].default) if p.name in named else p
            for p in theirs if p.kind is not Parameter.VAR_KEYWORD and p.name not in taken]
    tail = [p for p in theirs if p.kind is Parameter.VAR_KEYWORD]
    return inspect.Signature(head + ours + tail)


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
        # Per thread: the last encoder output, per row how many of its frames hold audio, and
        # the fingerprint of a one-row window.
        self._encoded_audio = threading.local()
        # Per thread, the last windows decoded greedily: a re-decode of the same audio (a
        # streaming client's growing buffer) is offered its previous hypothesis, and judged by
        # a policy of its own, since how well the loop pays differs from fresh audio.
        self.recent = RecentWindows() if redecodes else None
        self.redecode_policy = CallRouter(
            loop_first=REDECODE_LOOP_FIRST, min_probe_interval=REDECODE_PROBE_INTERVAL, max_probe_interval=REDECODE_PROBE_INTERVAL,
            probe_interval=REDECODE_PROBE_INTERVAL, next_probe=REDECODE_PROBE_INTERVAL)
        self._loop = threading.Lock()  # held by the one call in the speculative loop
        self._counting = threading.Lock()  # counters and policies touched outside the loop

    def __getattr__(self, name: str):
        return getattr(self._model, name)

    @property
    def stats(self) -> SpecStats:
        return self.decoder.stats

    def encode(self, features, to_cpu: bool = False):
        check_features(features)
        with Stopwatch() as watch:
            output = self.engines.encode(features, to_cpu=to_cpu)
        with self._counting:
            self.stats.encoder_seconds += watch.seconds
        fingerprint = window_fingerprint(features) if self.recent is not None else None
        self._encoded_audio.last = (output, audio_frames(features), fingerprint)
        return output

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
            return self.engines.generate(self._encoded(features), prompts, **kwargs)

        options = DecodingOptions(  # bad options raise here, before anything is decoded
            suppress_tokens=tuple(int(t) for t in kwargs.get("suppress_tokens", (-1,))),
            **{name: kwargs[name] for name in _OPTION_NAMES if name in kwargs},
        )
        encoder_output = self._encoded(features)
        # A greedy call on one window that this thread decoded before: its previous hypothesis.
        fingerprint = None if options.sampling else self._fingerprint(encoder_output)
        previous = None if fingerprint is None else self.recent.recall(fingerprint)
        # Without adaptive (and while tests swap drafters in) every call drafts.
        with self._counting:
            self.stats.redecodes += int(previous is not None)
            policy = self.redecode_policy if previous is not None else self.policy_for(options)
            # A seeded model samples in the loop only: which way a call goes depends on
            # timings, and the loop's draws do not (CTranslate2's would differ).
            repeatable = options.sampling and self.decoder.seeded
            speculative = policy.speculate(len(prompts)) if self.decoder.adaptive.route_calls and not repeatable else True
        # Another thread in the loop: this call takes CTranslate2's way rather than wait.
        held = in_loop = speculative and self._loop.acquire(blocking=repeatable)
        try:
            if in_loop:
                # A model deferred until its first use loads here, not in the call the policy times.
                self.decoder.runtime.prepare(recovery=self.decoder.drafter.needs_states)
                in_loop = speculative = self._drafter_opens()
            with Stopwatch() as watch:
                if in_loop:
                    results = self._speculative_rows(encoder_output, prompts, options, kwargs, previous)
                else:  # speculation measured slower (or is busy): the very call faster-whisper makes
                    results = self.engines.generate(encoder_output, prompts, **kwargs)
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
        return self.engines.detect_language(features, *args, **kwargs)

    def align(self, features, start_sequence, text_tokens, num_frames, median_filter_width: int = 7):
        return self.engines.align(features, start_sequence, text_tokens, num_frames, median_filter_width)

    def _fingerprint(self, encoder_output) -> Optional[Fingerprint]:
        """The fingerprint of the one-row window this thread encoded as ``encoder_output``."""
        encoded, _, fingerprint = getattr(self._encoded_audio, "last", (None, None, None))
        return fingerprint if encoded is encoder_output else None

    def _speculative_rows(self, encoder_output, prompts, options: DecodingOptions, kwargs: Dict[str, Any],
                          previous: Optional[Sequence[int]] = None) -> list:
        """The rows of a call decoded in the loop; ``previous``: the previous hypothesis of a
        one-row call's window, offered by a ``HypothesisDrafter`` around the model's drafter."""
        encoded, frames, _ = getattr(self._encoded_audio, "last", (None, None, None))
        frames = frames if encoded is encoder_output else None
        if previous is not None:
            drafter = HypothesisDrafter(self.decoder.drafter, self.decoder.runtime.special.timestamp_begin)
            drafter.remember(previous)
            with self.decoder.use_drafter(drafter, self.decoder.adaptive):
                return self._speculative_rows(encoder_output, prompts, options, kwargs)
        encoder_output = self.engines.local(encoder_output)  # the worker's copy, if it encoded
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

    def _encoded(self, features):
        """Encoder output for ``features``, which may already be encoded."""
        shape = features.shape
        if len(shape) == 3 and shape[1] == self._model.n_mels and shape[2] != shape[1]:
            return self.encode(features)
        return features

    def _fallback_reason(self, prompts, kwargs: Dict[str, Any]) -> Optional[str]:
        if kwargs.get("beam_size", 5) != 1:
            return _BEAM_SEARCH
        if self.inexact_reason is not None:
            return self.inexact_reason
        if self._unopened_drafter is not None and self._unopened_drafter is self.decoder.drafter:
            return _UNOPENED_DRAFTER
        sampling = kwargs.get("sampling_topk", 1) != 1 and kwargs.get("sampling_temperature", 1) != 0
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


class FlashWhisperModel(WhisperModel):
    """faster-whisper's ``WhisperModel`` with exact speculative decoding: greedy
    (``beam_size=1``) token for token, and temperature sampling (faster-whisper's fallback)
    exactly in distribution.

    Args:
        model_size_or_path: an embedded model name (``"tiny.en"``) or a CTranslate2 model
            directory. Nothing is ever downloaded.
        *args, **kwargs: every ``WhisperModel`` constructor argument (device, compute_type,
            cpu_threads, ...).
        drafter: a ``Drafter``, or the directory of a Whisper-Flash drafter: a converted one
            (``ct2-flash convert-drafter``; its ONNX graphs run in ONNX Runtime) or a training
            checkpoint (``drafter.json`` + ``drafter.safetensors``, run in PyTorch, which needs
            the ``[train]`` extra). None uses the drafter shipped for this model if there is
            one (``ct2_flash/drafters/<name>/``), otherwise ``PromptLookupDrafter``, a
            zero-cost built-in that only helps on repeated phrases. Where the loop never runs
            (int8 without ``near_exact``, a GPU) None loads nothing and the model holds a
            ``PromptLookupDrafter``; a drafter given is loaded, and checked, in any case.
        num_draft_tokens: K, the most tokens proposed per verification (default 8; clamped,
            with a warning, to what the drafter was trained for).
        adaptive: send a call to CTranslate2's own ``generate()`` when speculation measured
            slower per token, and until it has been measured (``routing.CallRouter``:
            ``generate()`` first, the loop measured a few calls later), and pause drafting
            inside a window while it measures slower than plain steps
            (``draft_pause.DraftPause``), and choose draft lengths from measured costs. The
            tokens are the same either way. False drafts every round of every call; an
            ``Adaptive`` turns on only some of these.
        decoder_threads: on CPU, run the speculative decode loop on a second copy of the model
            with this many CTranslate2 threads, while encoding (and any call that is not
            speculative) keeps ``cpu_threads``. The loop makes many small calls, for which one
            thread can be faster than several; the encoder is one large call that wants them
            all. Only where the loop can run (float32, or ``near_exact``). Costs the model's weights once more in memory; which is faster depends on the
            CPU (docs/usage.md, "Decoder threads"). None uses the one model; "auto" (default), for int8 models up to 512 wide (tiny, base), times
            a verification on both and keeps the faster (``thread_split``; the measurement is
            ``decoder_split``), and uses the one model otherwise.
        guard_margin: rows of a multi-token verification whose greedy choice is closer than
            this many logits to going another way are decided again by a single-token pass
            (``acceptance.Guard``); a number, or one per row of the block. Default: 1e-3 at
            float32, 2.0 at every other compute type, the smallest margin with the most
            identical windows measured (docs/exactness.md, ``bench/results/earlier/guard_margin/``).
            0 turns the guard off.
        seed: makes sampled decoding repeatable: the same calls on the same model give the
            same samples with the same drafter on the same machine (another drafter samples
            from the same distribution; ``decoding.SpeculativeDecoder``). With
            a seed, sampled calls always run in the speculative loop (the policy's choice
            depends on timings, and CTranslate2's ``generate()`` draws differently); it also
            seeds CTranslate2 (``ctranslate2.set_random_seed``, process-wide), which samples the
            calls the loop does not run (``near_exact``) repeatably too. None: fresh
            randomness. Greedy decoding draws nothing.
        draw_drafts: under sampling, draw drafts from the drafter's own distribution where it
            gives logits (the rejection rule with q); False proposes its most likely tokens
            outright (``decoding.SpeculativeDecoder``). The tokens' distribution is the
            target's either way.
        policy: decides per call whether the loop or ``generate()`` decodes it (default a new
            ``CallRouter``); used only with ``adaptive``. Re-decodes have a policy of
            their own (``self.model.redecode_policy``), which measures the loop first.
        redecodes: remember, per thread, the last windows decoded greedily (their first second
            of audio and their tokens, ``redecodes.REMEMBERED`` of them), and offer a window's previous
            hypothesis to the loop when the same audio is decoded again, as streaming clients
            do with their growing buffer every second (``redecodes``, ``drafting.hypothesis``);
            the output is the same either way. ``forget_windows()`` forgets this thread's.
            False: every decode is a first one (what benchmarks of fresh audio measure).
        near_exact: also run the loop at compute types other than float32 (int8, int16,
            float16), where a multi-token pass is not the computation single steps make: a
            row and the cache entries it writes move by up to ~1 logit at int8, and later
            near-ties (neighbouring timestamps first) can go another way, so the output equals
            faster-whisper's on most windows, not all (the measured rates: docs/exactness.md).
            False (default): at those compute types every call goes to CTranslate2's own
            ``generate()`` (one warning says so), so the output is always faster-whisper's;
            ``adaptive`` and ``seed`` then change nothing.
        stock_engine: True (default): run the encoder and every call outside the loop
            (``generate()`` where the loop does not run or does not pay, beam search,
            ``detect_language``, ``align``) on stock ctranslate2 in a worker process
            (``ct2_flash.stock``, started with the model without waiting for it), which is
            faster than the patched runtime on these CPUs; the output is then faster-whisper's
            on stock ctranslate2, the engine users run. The loop gets a copy of the encoder
            output when a call speculates, and greedy ``generate()`` calls run on the patched
            runtime instead where that measured faster (``routing.EngineRouter``). Costs a
            second copy of the model in memory (the sizes: README), though the patched copy
            loads only when a call first needs it, where its compute type is certain without
            loading (``engine.deferred_model``). If the worker cannot start
            or dies, one warning, and the patched runtime serves the calls (a dead worker is
            started again on the next call). CPU only. False: the patched runtime serves
            everything (output: faster-whisper's on the patched runtime).
        engine_policy: with the worker, decides per greedy ``generate()`` call which engine
            runs it (default a new ``EngineRouter``, which measures both); a benchmark or test
            that needs every call on one engine passes its own.
    """

    def __init__(
        self,
        model_size_or_path: str = "tiny.en",
        *args,
        drafter: Union[Drafter, str, None] = None,
        num_draft_tokens: int = 8,
        adaptive: Union[bool, Adaptive] = True,
        decoder_threads: Union[int, str, None] = "auto",
        guard_margin: Optional[float] = None,
        seed: Optional[int] = None,
        draw_drafts: bool = True,
        policy: Optional[CallRouter] = None,
        near_exact: bool = False,
        stock_engine: bool = True,
        engine_policy: Optional[EngineRouter] = None,
        redecodes: bool = True,
        **kwargs,
    ) -> None:
        if decoder_threads not in (None, "auto") and (isinstance(decoder_threads, bool) or not isinstance(decoder_threads, int)
                                                     or decoder_threads < 1):
            raise ValueError(f"decoder_threads must be None, 'auto' or an int >= 1, got {decoder_threads!r}")
        model_path = resolve_model(model_size_or_path)
        deferred = self._deferred_compute_type(model_path, args, kwargs, stock_engine)
        if deferred is not None and deferred.startswith("int8") and near_exact and decoder_threads == "auto":
            # The constructor times a one-thread decoder against the model (thread_split): on
            # a quiet CPU, not beside the worker's start.
            deferred = None
        stock, stopping = None, None
        if deferred is not None:
            # Nothing here loads the model then: the worker starts first, and loads its copy
            # while faster-whisper's constructor and ours run. It stops with the model, or with
            # a constructor that raises.
            stock = self._stock_engine(model_path, args, kwargs, seed, "cpu", deferred)
            stopping = weakref.finalize(self, stock.close)
        with deferring_loads(faster_whisper.transcribe, _deferred_build(deferred)) if deferred else contextlib.nullcontext():
            super().__init__(model_path, *args, **kwargs)
        special, vocabulary = load_vocabulary(model_path)
        # Where the loop never runs (int8 without near_exact, a GPU), no second model for it, and
        # no shipped drafter: its graphs and buffers would cost memory and start-up for nothing
        # (docs/usage.md, "Compute type"; a drafter the caller names still loads, so that a
        # wrong one fails here).
        loop_runs = inexact_reason(self.model.compute_type, near_exact, self.model.device) is None
        if drafter is None and not loop_runs:
            drafter = PromptLookupDrafter()
        drafter = _resolve_drafter(drafter, model_size_or_path, model_path, self.model.compute_type)
        # Its vocabulary and K: checked before any second model is loaded, by the loop's own check.
        num_draft_tokens = checked_draft_count(drafter, special.vocab_size, num_draft_tokens)
        config = load_config(model_path)
        runtime = TargetRuntime(
            self._decoder_model(model_path, decoder_threads if loop_runs else None),
            model_path,
            special,
            suppress_ids=config.get("suppress_ids", ()),
            suppress_ids_begin=config.get("suppress_ids_begin", ()),
        )
        if drafter.needs_states and loop_runs and deferred is None:
            # Otherwise the first speculative call would pay for it, and the policy would
            # measure speculation slower than it is (where the loop never runs, nothing pays;
            # a deferred model is loaded, and the recovery solved, before the loop's first call).
            runtime.prepare_recovery()
        if guard_margin is None:
            guard_margin = FLOAT32_GUARD if runtime.model.compute_type == "float32" else QUANTIZED_GUARD
        if seed is not None:
            ctranslate2.set_random_seed(seed)
        decoder = SpeculativeDecoder(runtime, drafter, num_draft_tokens, SpecStats(), adaptive=adaptive,
                                     guard_margin=guard_margin, seed=seed, draw_drafts=draw_drafts)
        if stock is None and stock_engine:
            stock = self._stock_engine(model_path, args, kwargs, seed, self.model.device, self.model.compute_type)
        engines = Engines(self.model, stock, engine_policy)
        if stopping is not None:
            stopping.detach()
        weakref.finalize(self, engines.close)  # the worker stops with the model, or at exit
        self.model = SpeculativeWhisper(self.model, decoder, vocabulary, policy or CallRouter(), near_exact,
                                        engines, redecodes)

    @staticmethod
    def _deferred_compute_type(model_path: str, args, kwargs, worker: bool) -> Optional[str]:
        """With the worker (which serves the first calls) on the CPU, the compute type the
        patched model will have when it loads at its first use (``engine.deferred_model``);
        None: it loads with the model, as in faster-whisper."""
        if not worker or not stock_installed():
            return None
        bound = inspect.signature(WhisperModel.__init__).bind(None, model_path, *args, **kwargs)
        bound.apply_defaults()
        options = bound.arguments
        if options["files"]:
            return None
        try:
            saved = CT2ModelFile(model_path).weight_dtypes()
        except ModelFileError:
            return None  # the runtime's own load raises faster-whisper's error for these files
        return deferred_compute_type(options["device"], options["device_index"], options["compute_type"], saved,
                                     ctranslate2.get_supported_compute_types, ctranslate2.get_cuda_device_count)

    def _stock_engine(self, model_path: str, args, kwargs, seed: Optional[int], device: str,
                      compute_type: str) -> Optional[StockEngine]:
        """The worker on stock ctranslate2, with this model's compute type and threads (CPU
        only: the measured penalty is the patched runtime's CPU kernels)."""
        if device != "cpu":
            logger.info("ct2-flash: stock_engine only applies on CPU; the %s model serves every call", device)
            return None
        bound = inspect.signature(WhisperModel.__init__).bind(self, model_path, *args, **kwargs).arguments
        engine = StockEngine(model_path, compute_type, intra_threads=bound.get("cpu_threads", 0),
                             inter_threads=bound.get("num_workers", 1), seed=seed)
        # It loads its model while the caller gets its audio ready: the first call does not wait
        # a whole start (about a second for tiny.en).
        engine.start()
        return engine

    def _decoder_model(self, model_path: str, threads: Union[int, str, None]):
        """The CTranslate2 model the speculative loop drives (see ``decoder_threads``)."""
        self.decoder_split = None
        auto = threads == "auto"
        if auto:
            width = _model_width(model_path)
            small = width <= AUTO_SPLIT_MAX_WIDTH
            threads = 1 if small and self.model.device == "cpu" and self.model.compute_type.startswith("int8") else None
        if threads is None:
            return self.model
        if self.model.device != "cpu":
            logger.info("ct2-flash: decoder_threads only applies on CPU; the %s model decodes", self.model.device)
            return self.model
        copy = ctranslate2.models.Whisper(model_path, device="cpu", compute_type=self.model.compute_type,
                                          intra_threads=threads)
        if not auto:
            return copy
        # Whether one thread runs the loop's passes faster than cpu_threads depends on the CPU.
        self.decoder_split = measure_split(self.model, copy, width)
        logger.info("ct2-flash: a 9-row verification takes %.1f ms on cpu_threads, %.1f ms on one thread: the loop "
                    "uses %s", self.decoder_split.shared_ms, self.decoder_split.one_thread_ms,
                    "a one-thread copy" if self.decoder_split.split else "the encoder's model")
        return copy if self.decoder_split.split else self.model

    @signature_of(WhisperModel.transcribe)
    def transcribe(self, audio, *args, **kwargs):
        """faster-whisper's ``transcribe()``, after ``audio.checked_audio``: bad audio raises
        ``AudioError`` (a ``ValueError``) naming the problem before anything is decoded, and
        the model stays usable. Its signature is faster-whisper's (``signature_of``)."""
        return super().transcribe(checked_audio(audio, self.feature_extractor.sampling_rate), *args, **kwargs)

    def window_features(self, audio: np.ndarray) -> np.ndarray:
        """[n_mels, 3000] log-mel features of the first 30 s of ``audio``, as faster-whisper's
        ``transcribe`` decodes its first window: without the last frame (computed from the
        padding; keeping it flipped a near-tie in a test clip) and zero-padded to 30 s."""
        frames = self.feature_extractor.nb_max_frames
        features = self.feature_extractor(audio)
        features = features[..., : max(1, features.shape[-1] - 1)][..., :frames]
        return np.pad(features, ((0, 0), (0, frames - features.shape[-1])))

    def encode_window(self, audio: np.ndarray):
        """Encoder output (StorageView [1, frames, d_model]) of ``window_features(audio)``."""
        features = self.window_features(audio)
        return self.reference_model.encode(ctranslate2.StorageView.from_array(np.ascontiguousarray(features[None])))

    @property
    def decoder(self) -> SpeculativeDecoder:
        """The speculative loop: its target runtime (``decoder.runtime``), drafter and settings."""
        return self.model.decoder

    @property
    def drafter(self) -> Drafter:
        return self.decoder.drafter

    @property
    def reference_model(self):
        """The ``ctranslate2.models.Whisper`` that faster-whisper's own calls use (encoder,
        ``generate()``, alignment): plain greedy on it is the output ct2-flash must equal."""
        return self.model._model

    def use_drafter(self, drafter: Drafter, adaptive: Union[bool, Adaptive] = False,
                    num_draft_tokens: Optional[int] = None,
                    lengths: Optional[DraftLengths] = None) -> ContextManager[Drafter]:
        """Decode with ``drafter`` inside the block, then restore the model's own
        (``SpeculativeDecoder.use_drafter``: the vocabulary and K are checked; ``lengths``, a
        draft-length policy for the block).

        ``adaptive`` is off by default so that every call drafts every round: comparing
        drafters wants them exercised, not the timing-dependent policy and the draft pause.
        """
        return self.decoder.use_drafter(drafter, adaptive, num_draft_tokens, lengths)

    @property
    def spec_stats(self) -> SpecStats:
        """Counters of the speculative loop since the last ``reset_spec_stats()``."""
        return self.model.stats

    def reset_spec_stats(self) -> None:
        self.model.stats.reset()

    def forget_windows(self) -> None:
        """Forget the windows this thread decoded (``redecodes``): the next decode of the same
        audio is a first one."""
        if self.model.recent is not None:
            self.model.recent.clear()


FlashWhisperModel.__init__.__signature__ = constructor_signature(FlashWhisperModel.__init__)


class BatchedInferencePipeline(faster_whisper.BatchedInferencePipeline):
    """faster-whisper's ``BatchedInferencePipeline`` whose ``transcribe()`` checks the audio
    first (``audio.checked_audio``), as ``FlashWhisperModel.transcribe`` does: a 2-D array,
    integer samples or an unreadable file raise ``AudioError`` before anything is decoded.
    faster-whisper's own class works with a ``FlashWhisperModel`` too; there, only NaN or
    infinite samples are caught (at the encoder, ``audio.check_features``)."""

    @signature_of(faster_whisper.BatchedInferencePipeline.transcribe)
    def transcribe(self, audio, *args, **kwargs):
        return super().transcribe(checked_audio(audio, self.model.feature_extractor.sampling_rate), *args, **kwargs)


def load_drafter(drafter: Union[Drafter, str, None] = None, model: str = "tiny.en",
                 compute_type: Optional[str] = None) -> Drafter:
    """The drafter ``FlashWhisperModel(model, drafter=drafter)`` would decode with.

    Args:
        drafter: None for the drafter shipped for the model (prompt lookup where none is), a
            converted drafter directory, an unconverted training checkpoint (PyTorch, slower),
            or a ``Drafter``, returned as it is.
        model: a model name (``available_models()``) or a CTranslate2 model directory.
        compute_type: the engine's compute type (``model.compute_type``) the drafter will serve;
            None does not check it.

    Raises:
        CheckpointError: the directory is missing or damaged.
        DrafterMismatchError: the drafter was made for another target, or adapted
            (``ct2-flash adapt``) for another model or compute type.
    """
    return _resolve_drafter(drafter, model, resolve_model(model), compute_type)


def _resolve_drafter(drafter: Union[Drafter, str, None], name: str, model_path: str,
                     compute_type: Optional[str] = None) -> Drafter:
    """A Drafter from what the user passed (see ``FlashWhisperModel``)."""
    if isinstance(drafter, Drafter):
        return drafter
    if drafter is None:
        # The embedded model's drafter also serves its directory given as a path.
        shipped = os.path.join(SHIPPED_DRAFTERS, embedded_name(model_path) or name)
        if not os.path.isfile(os.path.join(shipped, "drafter.json")):
            return PromptLookupDrafter()
        drafter = shipped
    if not isinstance(drafter, str):
        raise TypeError(f"drafter must be a ct2_flash.Drafter, a checkpoint directory or None, not {type(drafter).__name__}")
    # Here: ONNX Runtime loads only for a model that has a drafter directory.
    from ct2_flash.drafting.onnx_drafter import OnnxDrafter, has_graphs

    if not os.path.isdir(drafter):
        raise CheckpointError(f"drafter directory {drafter!r} does not exist")
    check_adapted(drafter, model_path, compute_type)
    if has_graphs(drafter):
        return OnnxDrafter(drafter, model_path)
    # A training checkpoint not yet converted runs in PyTorch (the [train] extra), the slower
    # reference implementation of the same round.
    try:
        from ct2_flash.drafting.flash_drafter import FlashDrafter, load_checkpoint
    except ImportError:
        raise CheckpointError(f"drafter {drafter!r} has no exported graphs and PyTorch is not installed to run it "
                              f"as a checkpoint; convert it with: ct2-flash convert-drafter {drafter} OUT "
                              f"(pip install 'ct2-flash[train]')") from None
    logger.warning("ct2-flash: drafter %s is an unconverted checkpoint and runs in PyTorch, which is slower; "
                   "convert it with: ct2-flash convert-drafter %s OUT", drafter, drafter)
    return FlashDrafter(load_checkpoint(drafter, model_path))


def _deferred_build(resolved: str) -> Callable:
    """What builds faster-whisper's model in its constructor, with ``ctranslate2.models.Whisper``'s
    parameters: a ``DeferredWhisper`` at the ``resolved`` compute type (its files were read by
    ``_deferred_compute_type``)."""
    def build(path, device="cpu", device_index=0, compute_type="default", files=None, **loader_options):
        return DeferredWhisper(ctranslate2.models.Whisper, path, resolved, **loader_options)

    return build


def _model_width(model_path: str) -> int:
    """d_model of a CTranslate2 Whisper model (read from model.bin's header, no weights)."""
    return int(CT2ModelFile(model_path)["decoder/embeddings/weight"].shape[1])
