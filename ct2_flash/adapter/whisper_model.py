"""The faster-whisper adapter: ``FlashWhisperModel``.

faster-whisper routes every model call through ``WhisperModel.model`` (encode, generate,
detect_language, align). ``FlashWhisperModel`` replaces that attribute with
``SpeculativeWhisper`` (``speculative_whisper.py``), which forwards everything to the engines
except greedy and sampled ``generate()`` rows, which it may decode with the speculative loop. ``transcribe()`` and
``BatchedInferencePipeline`` are inherited unchanged, so every option they implement (VAD,
word timestamps, prompts, fallback, long audio) behaves as in faster-whisper.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import warnings
import weakref
from typing import Callable, ContextManager, Optional, Union

import ctranslate2
import faster_whisper
import numpy as np
from faster_whisper import WhisperModel

from ct2_flash.adapter.audio import OneThreadFeatures, checked_audio
from ct2_flash.adapter.engine_pair import Engines
from ct2_flash.adapter.routing import CallRouter, EngineRouter, inexact_reason
from ct2_flash.adapter.speculative_whisper import SpeculativeWhisper
from ct2_flash.adapter.thread_split import measure_split
from ct2_flash.drafting.base import Drafter
from ct2_flash.drafting.kinds import open_drafter
from ct2_flash.drafting.prompt_lookup import PromptLookupDrafter
from ct2_flash.engine.deferred_model import DeferredWhisper, deferred_compute_type, deferring_loads
from ct2_flash.engine.model_files import CT2ModelFile, ModelFileError
from ct2_flash.engine.models import resolve_model
from ct2_flash.loop.decoding import Adaptive, SpeculativeDecoder, checked_draft_count
from ct2_flash.loop.draft_lengths import DraftLengths
from ct2_flash.loop.stats import SpecStats
from ct2_flash.loop.target import TargetRuntime
from ct2_flash.loop.vocabulary import load_config, load_vocabulary
from ct2_flash.stock.client import StockEngine
from ct2_flash.stock.location import installed as stock_installed

logger = logging.getLogger("ct2_flash")

# Default guard margins (logits). float32 rows are within 5e-5 of single steps; at int8 2.0 is
# where identity stops improving (bench/results/earlier/guard_margin/int8.json).
FLOAT32_GUARD = 1e-3
QUANTIZED_GUARD = 2.0
# decoder_threads="auto" splits off a one-thread decoder for models up to this width.
AUTO_SPLIT_MAX_WIDTH = 512
# The most rows one stock ``generate()`` call decodes by default, where batching is exact
# (``batch_rows``; the measurement behind it: docs/measurements.md, "Batching").
DEFAULT_BATCH_ROWS = 16


def default_batch_rows(compute_type: str) -> int:
    """``batch_rows`` where not given: ``DEFAULT_BATCH_ROWS`` at the int8 compute types, where
    stock CTranslate2 gives a row the same tokens and scores, bit for bit, inside a batch as
    alone (the worker checks each CPU before it first batches); 1 elsewhere: at float32 the
    tokens matched but scores moved in their last digits (docs/exactness.md, "Batching")."""
    return DEFAULT_BATCH_ROWS if compute_type.startswith("int8") else 1


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
    head = [
        p.replace(default=named[p.name].default) if p.name in named else p
        for p in theirs
        if p.kind is not Parameter.VAR_KEYWORD and p.name not in taken
    ]
    tail = [p for p in theirs if p.kind is Parameter.VAR_KEYWORD]
    return inspect.Signature(head + ours + tail)


class FlashWhisperModel(WhisperModel):
    """faster-whisper's ``WhisperModel`` with exact speculative decoding: greedy
    (``beam_size=1``) token for token, and temperature sampling (faster-whisper's fallback)
    exactly in distribution.

    Args:
        model_size_or_path: an embedded model name (``"tiny.en"``) or a CTranslate2 model
            directory. Nothing is ever downloaded.
        *args, **kwargs: every ``WhisperModel`` constructor argument (device, compute_type,
            cpu_threads, ...).
        drafter: a ``Drafter``, a name (``"builtin"``: ``PromptLookupDrafter``; ``"oracle"``:
            the target's own greedy output, for tests), or the directory of a Whisper-Flash drafter: a converted one
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
            (``guard.Guard``); a number, or one per row of the block. Default: 1e-3 at
            float32, 2.0 at every other compute type, the smallest margin with the most
            identical windows measured (docs/exactness.md, ``bench/results/earlier/guard_margin/``).
            0 turns the guard off.
        seed: makes sampled decoding repeatable: the same calls on the same model give the
            same samples with the same drafter on the same machine (another drafter samples
            from the same distribution; ``decoding.SpeculativeDecoder``). With
            a seed, sampled calls always run in the speculative loop (the call router's choice
            depends on timings, and CTranslate2's ``generate()`` draws differently); it also
            seeds CTranslate2 (``ctranslate2.set_random_seed``, process-wide), which samples the
            calls the loop does not run (``near_exact``) repeatably too. None: fresh
            randomness. Greedy decoding draws nothing.
        draw_drafts: under sampling, draw drafts from the drafter's own distribution where it
            gives logits (the rejection rule with q); False proposes its most likely tokens
            outright (``decoding.SpeculativeDecoder``). The tokens' distribution is the
            target's either way.
        call_router: decides per greedy call whether the loop or ``generate()`` decodes it
            (default a new ``CallRouter``); used only with ``adaptive``. Re-decodes have routers
            of their own, by the length of the previous hypothesis
            (``self.model.redecode_routers``, ``routing.RedecodeRouters``), which measure the
            loop first. ``policy=``, its former name, still works and warns.
        redecodes: remember, per thread, the last windows decoded greedily (their first second
            of audio and their tokens, ``redecodes.memory.REMEMBERED`` of them), and offer a window's previous
            hypothesis to the loop when the same audio is decoded again, as streaming clients
            do with their growing buffer every second (``redecodes``);
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
            output when a call speculates; every other call stays in the worker
            (``routing.EngineRouter``). Costs a
            second copy of the model in memory (the sizes: README), though the patched copy
            loads only when a call first needs it, where its compute type is certain without
            loading (``engine.deferred_model``). If the worker cannot start
            or dies, one warning, and the patched runtime serves the calls (a dead worker is
            started again on the next call). CPU only. False: the patched runtime serves
            everything (output: faster-whisper's on the patched runtime).
        batch_rows: with the worker, the most rows one ``generate()`` call there decodes:
            concurrent calls (threads sharing the model: ``num_workers``, a server's requests,
            ``ct2-flash transcribe``'s files in flight) whose prompt layout and options match
            run as one call, each caller getting its own rows (``stock.batching``). None:
            ``default_batch_rows`` (16 at int8, where a row's tokens and scores are the same
            in a batch; 1, no batching, at float32). Each caller's output is the same either
            way where the CPU is batch-invariant, which the worker checks before batching.
        batch_wait: seconds a call may wait for partners while other calls are being served
            (default 0: it takes those already waiting, and a lone call never waits).
        engine_router: with the worker, decides per greedy ``generate()`` call which engine
            runs it (default a new ``EngineRouter``: the worker; ``EngineRouter(measure=True)``
            measures both); a benchmark or test that needs every call on one engine passes its
            own. ``engine_policy=``, its former name, still works and warns.
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
        call_router: Optional[CallRouter] = None,
        near_exact: bool = False,
        stock_engine: bool = True,
        engine_router: Optional[EngineRouter] = None,
        redecodes: bool = True,
        batch_rows: Optional[int] = None,
        batch_wait: float = 0.0,
        policy: Optional[CallRouter] = None,
        engine_policy: Optional[EngineRouter] = None,
        **kwargs,
    ) -> None:
        call_router = _renamed("policy", policy, "call_router", call_router)
        engine_router = _renamed("engine_policy", engine_policy, "engine_router", engine_router)
        _check_decoder_threads(decoder_threads)
        _check_batching(batch_rows, batch_wait)
        batching = (batch_rows, batch_wait)
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
            stock = self._stock_engine(model_path, args, kwargs, seed, "cpu", deferred, batching)
            stopping = weakref.finalize(self, stock.close)
        with (
            deferring_loads(faster_whisper.transcribe, _deferred_build(deferred))
            if deferred
            else contextlib.nullcontext()
        ):
            super().__init__(model_path, *args, **kwargs)
        decoder, vocabulary = self._decoder(
            model_path,
            model_size_or_path,
            drafter=drafter,
            num_draft_tokens=num_draft_tokens,
            adaptive=adaptive,
            decoder_threads=decoder_threads,
            guard_margin=guard_margin,
            seed=seed,
            draw_drafts=draw_drafts,
            near_exact=near_exact,
            deferred=deferred,
        )
        if stock is None and stock_engine:
            stock = self._stock_engine(
                model_path, args, kwargs, seed, self.model.device, self.model.compute_type, batching
            )
        engines = Engines(self.model, stock, engine_router)
        if stopping is not None:
            stopping.detach()
        weakref.finalize(self, engines.close)  # the worker stops with the model, or at exit
        self.model = SpeculativeWhisper(self.model, decoder, vocabulary, call_router, near_exact, engines, redecodes)
        self.feature_extractor = OneThreadFeatures(self.feature_extractor)

    def _decoder(
        self,
        model_path: str,
        name: str,
        *,
        drafter: Union[Drafter, str, None],
        num_draft_tokens: int,
        adaptive: Union[bool, Adaptive],
        decoder_threads: Union[int, str, None],
        guard_margin: Optional[float],
        seed: Optional[int],
        draw_drafts: bool,
        near_exact: bool,
        deferred: Optional[str],
    ) -> tuple:
        """(the loop's ``SpeculativeDecoder`` with its drafter and target runtime, the
        vocabulary), once faster-whisper's constructor has built ``self.model``."""
        special, vocabulary = load_vocabulary(model_path)
        # Where the loop never runs (int8 without near_exact, a GPU), no second model for it, and
        # no shipped drafter: its graphs and buffers would cost memory and start-up for nothing
        # (docs/usage.md, "Compute type"; a drafter the caller names still loads, so that a
        # wrong one fails here).
        loop_runs = inexact_reason(self.model.compute_type, near_exact, self.model.device) is None
        if drafter is None and not loop_runs:
            drafter = PromptLookupDrafter()
        drafter = open_drafter(drafter, name, model_path, self.model.compute_type)
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
            # Otherwise the first speculative call would pay for it, and the call router would
            # measure speculation slower than it is (where the loop never runs, nothing pays;
            # a deferred model is loaded, and the recovery solved, before the loop's first call).
            runtime.prepare_recovery()
        if guard_margin is None:
            guard_margin = FLOAT32_GUARD if runtime.model.compute_type == "float32" else QUANTIZED_GUARD
        if seed is not None:
            ctranslate2.set_random_seed(seed)
        decoder = SpeculativeDecoder(
            runtime,
            drafter,
            num_draft_tokens,
            SpecStats(),
            adaptive=adaptive,
            guard_margin=guard_margin,
            seed=seed,
            draw_drafts=draw_drafts,
        )
        return decoder, vocabulary

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
        return deferred_compute_type(
            options["device"],
            options["device_index"],
            options["compute_type"],
            saved,
            ctranslate2.get_supported_compute_types,
            ctranslate2.get_cuda_device_count,
        )

    def _stock_engine(
        self, model_path: str, args, kwargs, seed: Optional[int], device: str, compute_type: str, batching: tuple
    ) -> Optional[StockEngine]:
        """The worker on stock ctranslate2, with this model's compute type and threads (CPU
        only: the measured penalty is the patched runtime's CPU kernels), batching as
        ``batching`` = (``batch_rows``, ``batch_wait``) says."""
        batch_rows, batch_wait = batching
        if device != "cpu":
            logger.info("ct2-flash: stock_engine only applies on CPU; the %s model serves every call", device)
            return None
        bound = inspect.signature(WhisperModel.__init__).bind(self, model_path, *args, **kwargs).arguments
        engine = StockEngine(
            model_path,
            compute_type,
            intra_threads=bound.get("cpu_threads", 0),
            inter_threads=bound.get("num_workers", 1),
            seed=seed,
            max_batch_rows=default_batch_rows(compute_type) if batch_rows is None else batch_rows,
            batch_wait=batch_wait,
        )
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
        copy = ctranslate2.models.Whisper(
            model_path, device="cpu", compute_type=self.model.compute_type, intra_threads=threads
        )
        if not auto:
            return copy
        # Whether one thread runs the loop's passes faster than cpu_threads depends on the CPU.
        self.decoder_split = measure_split(self.model, copy, width)
        logger.info(
            "ct2-flash: a 9-row verification takes %.1f ms on cpu_threads, %.1f ms on one thread: the loop uses %s",
            self.decoder_split.shared_ms,
            self.decoder_split.one_thread_ms,
            "a one-thread copy" if self.decoder_split.split else "the encoder's model",
        )
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

    def use_drafter(
        self,
        drafter: Drafter,
        adaptive: Union[bool, Adaptive] = False,
        num_draft_tokens: Optional[int] = None,
        lengths: Optional[DraftLengths] = None,
    ) -> ContextManager[Drafter]:
        """Decode with ``drafter`` inside the block, then restore the model's own
        (``SpeculativeDecoder.use_drafter``: the vocabulary and K are checked; ``lengths``, a
        draft-length policy for the block).

        ``adaptive`` is off by default so that every call drafts every round: comparing
        drafters wants them exercised, not the timing-dependent router and the draft pause.
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


def _renamed(old: str, old_value, new: str, value):
    """A constructor argument given by its former keyword ``old``: its value, with a
    ``DeprecationWarning``; both given is an error."""
    if old_value is None:
        return value
    if value is not None:
        raise TypeError(f"FlashWhisperModel() got both {old}= and {new}=; pass {new}= only")
    warnings.warn(
        f"FlashWhisperModel({old}=...) is now {new}=...; {old}= will be removed", DeprecationWarning, stacklevel=3
    )
    return old_value


def _check_batching(batch_rows, batch_wait) -> None:
    if batch_rows is not None and (isinstance(batch_rows, bool) or not isinstance(batch_rows, int) or batch_rows < 1):
        raise ValueError(f"batch_rows must be an integer >= 1 (1: no batching) or None, got {batch_rows!r}")
    if isinstance(batch_wait, bool) or not isinstance(batch_wait, (int, float)) or not batch_wait >= 0:
        raise ValueError(f"batch_wait must be a number of seconds >= 0, got {batch_wait!r}")


def _check_decoder_threads(decoder_threads) -> None:
    if decoder_threads not in (None, "auto") and (
        isinstance(decoder_threads, bool) or not isinstance(decoder_threads, int) or decoder_threads < 1
    ):
        raise ValueError(f"decoder_threads must be None, 'auto' or an int >= 1, got {decoder_threads!r}")


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
