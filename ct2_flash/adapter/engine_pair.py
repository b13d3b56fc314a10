"""Which engine serves each model call: stock ``ctranslate2`` in the worker where it can, the
patched runtime where it must (the loop) or where the worker cannot answer.

``Engines`` wraps the patched model and an optional ``StockEngine``. Encoder outputs made by
the worker are ``RemoteEncoding``s; calls taking one go to the worker, and the loop gets a
local copy (``local``). When the worker fails, one warning is logged and the call is served by
the patched runtime, re-encoding the features the encoding kept: the output is the patched
runtime's (the same tokens on every clip measured), only slower.

A greedy ``generate()`` on a worker's encoding runs in the worker, or where an ``EngineRouter``
that measures both engines found it faster: in the patched runtime on a copy of the encoding
(``engine_for``, asked once per call by ``SpeculativeWhisper.route``). The encoder always runs in
the worker: its output is what stock faster-whisper decodes from, and the patched encoder's
differs from it in the last bits (and is slower: docs/measurements.md).
"""

from __future__ import annotations

import logging
import threading
from typing import Optional

import ctranslate2
import numpy as np

from ct2_flash.adapter.routing import EngineRouter, produced_tokens
from ct2_flash.engine.deferred_model import load_before_timing
from ct2_flash.loop.clock import Stopwatch
from ct2_flash.loop.options import one_greedy_hypothesis
from ct2_flash.stock.client import RemoteEncoding, StockEngine, StockUnavailable

logger = logging.getLogger("ct2_flash")


class Engines:
    """Args:
        model: the patched runtime's ``ctranslate2.models.Whisper`` (faster-whisper's own model).
        stock: the worker, or None to use the patched runtime for everything.
        engine_router: which engine runs greedy ``generate()`` calls on a worker's encoding
            (default a new ``EngineRouter``).

    Attributes:
        generate_calls: engine ("stock", "patched") -> ``generate()`` calls it served.
    """

    def __init__(
        self, model, stock: Optional[StockEngine] = None, engine_router: Optional[EngineRouter] = None
    ) -> None:
        self.model = model
        self.stock = stock
        self.engine_router = engine_router or EngineRouter()
        self.stock_failures = 0
        self.generate_calls = {"stock": 0, "patched": 0}
        self._warned = False
        self._choosing = threading.Lock()  # the router and counters, shared by num_workers threads

    @property
    def stock_active(self) -> bool:
        return self.stock is not None and self.stock.disabled is None

    def encode(self, features, to_cpu: bool = False):
        """An encoder output: a ``RemoteEncoding`` from the worker, or a StorageView."""
        if self.stock_active:
            try:
                return self.stock.encode(np.asarray(features))
            except StockUnavailable as error:
                self._failed(error)
        return self.model.encode(features, to_cpu=to_cpu)

    def local(self, encoder_output):
        """The encoder output as a StorageView on this side [batch, frames, d_model] (a copy of
        the worker's, kept with the encoding for later calls on it, or the patched runtime's own
        encoding of the same features)."""
        if not isinstance(encoder_output, RemoteEncoding):
            return encoder_output
        if encoder_output.copy is None:
            try:
                encoder_output.copy = ctranslate2.StorageView.from_array(self.stock.fetch(encoder_output))
            except StockUnavailable as error:
                self._failed(error)
                return self.model.encode(ctranslate2.StorageView.from_array(encoder_output.features))
        return encoder_output.copy

    def engine_for(self, encoder_output, options: dict, rows: int) -> str:
        """Which engine serves ``generate(encoder_output, prompts, **options)`` with ``rows``
        prompts: "stock" (the worker holding the encoding) or "patched" (the runtime here: an
        encoding made here, or a greedy call the ``engine_router`` sends here)."""
        if not isinstance(encoder_output, RemoteEncoding):
            return "patched"
        with self._choosing:
            patched = one_greedy_hypothesis(options) and self.engine_router.use_patched(rows)
        return "patched" if patched else "stock"

    def generate(self, encoder_output, prompts, engine: Optional[str] = None, **options):
        """``Whisper.generate`` on ``engine`` (``engine_for`` where not given)."""
        remote = isinstance(encoder_output, RemoteEncoding)
        greedy = remote and one_greedy_hypothesis(options)
        patched = (engine or self.engine_for(encoder_output, options, len(prompts))) == "patched" or not remote
        if patched:
            load_before_timing(self.model)  # the router measures the decoder, not a deferred load
        failures = self.stock_failures
        results = None
        with Stopwatch() as watch:  # from the first try: a failed worker call is part of the cost
            if not patched:
                try:
                    results = self.stock.generate(encoder_output, prompts, options)
                    engine, measured = "stock", greedy
                except StockUnavailable as error:
                    self._failed(error)
            if results is None:
                results = self.model.generate(self.local(encoder_output), prompts, **options)
                # A call the worker failed (re-encoded here) is no measure of the patched decoder.
                engine, measured = "patched", greedy and self.stock_failures == failures
        self._served(engine, measured, len(prompts), watch.seconds, results)
        return results

    def detect_language(self, features, *args, **kwargs):
        if isinstance(features, RemoteEncoding) and not args and not kwargs:
            try:
                return self.stock.detect_language(features)
            except StockUnavailable as error:
                self._failed(error)
        return self.model.detect_language(self.local(features), *args, **kwargs)

    def align(self, features, start_sequence, text_tokens, num_frames, median_filter_width: int = 7):
        if isinstance(features, RemoteEncoding):
            try:
                return self.stock.align(features, start_sequence, text_tokens, num_frames, median_filter_width)
            except StockUnavailable as error:
                self._failed(error)
        return self.model.align(
            self.local(features), start_sequence, text_tokens, num_frames, median_filter_width=median_filter_width
        )

    def _served(self, engine: str, measured: bool, rows: int, seconds: float, results) -> None:
        tokens = produced_tokens(results)
        with self._choosing:
            self.generate_calls[engine] += 1
            if measured:
                self.engine_router.record(engine == "patched", rows, seconds, tokens)

    def close(self) -> None:
        if self.stock is not None:
            self.stock.close()

    def _failed(self, error: StockUnavailable) -> None:
        self.stock_failures += 1
        # One warning, then quiet: the patched runtime gives the same output.
        # The message only: a log record holding the exception would keep its frames, and the
        # model in them, alive.
        (logger.info if self._warned else logger.warning)(
            "ct2-flash: %s; the patched runtime serves this call%s",
            str(error),
            "" if self.stock_active else " and every later one",
        )
        self._warned = True
