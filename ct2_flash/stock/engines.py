"""Which engine serves each model call: stock ``ctranslate2`` in the worker where it can, the
patched runtime where it must (the loop) or where the worker cannot answer.

``Engines`` wraps the patched model and an optional ``StockEngine``. Encoder outputs made by
the worker are ``RemoteEncoding``s; every call taking one goes to the worker, and the loop gets
a local copy (``local``). When the worker fails, one warning is logged and the call is served
by the patched runtime, re-encoding the features the encoding kept: the output is the same,
only slower.
"""

from __future__ import annotations

import logging
from typing import Optional

import ctranslate2
import numpy as np

from ct2_flash.stock.client import RemoteEncoding, StockEngine, StockUnavailable

logger = logging.getLogger("ct2_flash")


class Engines:
    """Args:
        model: the patched runtime's ``ctranslate2.models.Whisper`` (faster-whisper's own model).
        stock: the worker, or None to use the patched runtime for everything.
    """

    def __init__(self, model, stock: Optional[StockEngine] = None) -> None:
        self.model = model
        self.stock = stock
        self.stock_failures = 0
        self._warned = False

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
        the worker's, or the patched runtime's own encoding of the same features)."""
        if not isinstance(encoder_output, RemoteEncoding):
            return encoder_output
        try:
            return ctranslate2.StorageView.from_array(self.stock.fetch(encoder_output))
        except StockUnavailable as error:
            self._failed(error)
        return self.model.encode(ctranslate2.StorageView.from_array(encoder_output.features))

    def generate(self, encoder_output, prompts, **options):
        """``Whisper.generate`` on the engine holding the encoder output."""
        if isinstance(encoder_output, RemoteEncoding):
            try:
                return self.stock.generate(encoder_output, prompts, options)
            except StockUnavailable as error:
                self._failed(error)
        return self.model.generate(self.local(encoder_output), prompts, **options)

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
        return self.model.align(self.local(features), start_sequence, text_tokens, num_frames,
                                median_filter_width=median_filter_width)

    def close(self) -> None:
        if self.stock is not None:
            self.stock.close()

    def _failed(self, error: StockUnavailable) -> None:
        self.stock_failures += 1
        # One warning, then quiet: the patched runtime gives the same output.
        # The message only: a log record holding the exception would keep its frames, and the
        # model in them, alive.
        (logger.info if self._warned else logger.warning)(
            "ct2-flash: %s; the patched runtime serves this call%s", str(error),
            "" if self.stock_active else " and every later one")
        self._warned = True
