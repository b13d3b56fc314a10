"""Guard margins per model, compute type and block row, measured rather than assumed.

A row of a multi-token verification is not the same computation as the single step greedy
decoding performs: at float32 they differ by ~1e-5 logits, at int8 by up to about a logit
(CTranslate2 quantizes activations per pass, so a batched pass can round differently). The
loop re-decides a row whose choice is closer than its margin with a single-token pass
(``SpeculativeDecoder(guard_margin=...)``). ``bench/guard_margin.py`` measures the
decision-relevant deviation of every verified row against single steps on real speech, in the
loop, by row of the block, and stores the largest one times a safety factor here
(``data/guard_margins.json``). Models or compute types without a measurement get the fixed
defaults.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from typing import Dict, List, Optional, Tuple

from .drafter_files import TargetIdentity

GUARD_TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "guard_margins.json")
_IDENTITY_FIELDS = ("vocab_size", "d_model", "n_mels", "tokenizer_sha256")


def derive_margins(largest: Dict[int, float], rows: int, safety: float) -> List[float]:
    """Margin per block row from the largest deviation measured there.

    Rows never measured (blocks that were never that long) get the largest margin of those
    measured, and a margin never decreases along the block (a later row has at least the
    earlier rows' error behind it).
    """
    if not largest:
        raise ValueError("no verified rows were measured")
    if safety < 1.0:
        raise ValueError("safety must be >= 1")
    fallback = max(largest.values())
    margins, running = [], 0.0
    for row in range(rows):
        running = max(running, largest.get(row, fallback))
        margins.append(round(running * safety, 4))
    return margins


def margins_for(target: TargetIdentity, compute_type: str, table: str = GUARD_TABLE) -> Optional[Tuple[float, ...]]:
    """The measured margins for this model and compute type, or None."""
    if not os.path.isfile(table):
        return None
    with open(table, encoding="utf-8") as stream:
        entries = json.load(stream)
    for entry in entries.values():
        if all(entry["identity"].get(name) == getattr(target, name) for name in _IDENTITY_FIELDS):
            margins = entry["margins"].get(compute_type)
            return tuple(float(m) for m in margins["per_row"]) if margins else None
    return None


def write_margins(model_name: str, compute_type: str, margins: List[float], source: str,
                  table: str = GUARD_TABLE, model_path: Optional[str] = None) -> None:
    """Store ``margins`` for ``model_name`` (resolved like ``FlashWhisperModel``) and ``compute_type``."""
    from .drafter_files import target_identity
    from .models import resolve_model

    identity = target_identity(model_path or resolve_model(model_name), model_name)
    entries = {}
    if os.path.isfile(table):
        with open(table, encoding="utf-8") as stream:
            entries = json.load(stream)
    entry = entries.setdefault(model_name, {"identity": {k: v for k, v in asdict(identity).items() if k in _IDENTITY_FIELDS},
                                            "margins": {}})
    entry["margins"][compute_type] = {"per_row": margins, "source": source}
    with open(table + ".tmp", "w", encoding="utf-8") as stream:
        json.dump(entries, stream, indent=2)
    os.replace(table + ".tmp", table)
