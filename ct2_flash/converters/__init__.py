"""Converters: a trained drafter checkpoint -> the deployable drafter directory.

Like CTranslate2's converters, each is one template (load -> validate -> export -> verify ->
save) that refuses to overwrite an existing output without ``force``. They need PyTorch and
``onnx`` (``pip install 'ct2-flash[train]'``); what they write runs without either.

- ``drafter``: ``convert_drafter`` (``ct2-flash convert-drafter``);
- ``graphs``: the draft round as three exportable modules (one ONNX graph each);
- ``row_graph``: the ONNX graph behind ``loop.row_scores``.
"""

from ct2_flash.converters.drafter import ConversionError, convert_drafter

__all__ = ["ConversionError", "convert_drafter"]
