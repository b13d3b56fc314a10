"""Numbers from per-utterance measurements: paired bootstrap intervals, duration buckets, WER."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

# Lower bounds in seconds; the last bucket is open.
BUCKET_EDGES: Tuple[float, ...] = (0.0, 5.0, 10.0, 20.0, 30.0)


def bucket_of(seconds: float) -> str:
    """The duration bucket label of an utterance: "[0,5)", "[5,10)", ... or ">=30"."""
    if seconds < 0 or not np.isfinite(seconds):
        raise ValueError(f"duration must be a finite non-negative number, got {seconds}")
    for low, high in zip(BUCKET_EDGES, BUCKET_EDGES[1:]):
        if seconds < high:
            return f"[{low:g},{high:g})"
    return f">={BUCKET_EDGES[-1]:g}"


def bucket_labels() -> List[str]:
    """Every bucket label, shortest first."""
    return [f"[{low:g},{high:g})" for low, high in zip(BUCKET_EDGES, BUCKET_EDGES[1:])] + [f">={BUCKET_EDGES[-1]:g}"]


def paired_bootstrap(
    baseline: Sequence[float], candidate: Sequence[float], samples: int = 2000, confidence: float = 0.95, seed: int = 0
) -> Dict[str, float]:
    """Speedup sum(baseline) / sum(candidate) with a paired bootstrap interval.

    Utterances are resampled with replacement, keeping each baseline time with its own
    candidate time, so per-utterance difficulty cancels and only the pairing's spread counts.

    Args:
        baseline, candidate: [n] seconds per utterance, same order.
    Returns:
        {"speedup", "low", "high"}; low == high == speedup for a single utterance.
    """
    base, cand = np.asarray(baseline, dtype=np.float64), np.asarray(candidate, dtype=np.float64)
    if base.shape != cand.shape or base.ndim != 1 or base.size == 0:
        raise ValueError("need two equally long, non-empty sequences of times")
    if (cand <= 0).any() or (base <= 0).any():
        raise ValueError("times must be positive")
    if not 0 < confidence < 1:
        raise ValueError("confidence must be in (0, 1)")
    point = float(base.sum() / cand.sum())
    rng = np.random.default_rng(seed)
    index = rng.integers(0, base.size, size=(samples, base.size))
    ratios = base[index].sum(1) / cand[index].sum(1)
    tail = (1 - confidence) / 2
    low, high = np.quantile(ratios, [tail, 1 - tail])
    return {"speedup": point, "low": float(low), "high": float(high)}


def _normalised_pairs(references: Sequence[str], hypotheses: Sequence[str]) -> List[Tuple[str, str]]:
    """(reference, hypothesis) after Whisper's English normalisation, without empty references."""
    from whisper_normalizer.english import EnglishTextNormalizer

    normalise = EnglishTextNormalizer()
    pairs = [(normalise(r), normalise(h)) for r, h in zip(references, hypotheses) if r and r.strip()]
    return [(r, h) for r, h in pairs if r.strip()]  # a reference of only fillers says nothing


def word_error_rate(references: Sequence[str], hypotheses: Sequence[str]) -> Optional[float]:
    """Corpus WER after Whisper's English normalisation; None without any reference text."""
    import jiwer

    pairs = _normalised_pairs(references, hypotheses)
    if not pairs:
        return None
    return float(jiwer.wer([r for r, _ in pairs], [h for _, h in pairs]))


def word_error_rate_interval(
    references: Sequence[str], hypotheses: Sequence[str], samples: int = 2000, confidence: float = 0.95, seed: int = 0
) -> Optional[Dict[str, float]]:
    """Corpus WER (as ``word_error_rate``) with a bootstrap interval over utterances: sampled
    transcripts differ by chance, so their WERs are compared with their spread.

    Returns:
        {"wer", "low", "high"}, or None without any reference text.
    """
    import jiwer

    pairs = _normalised_pairs(references, hypotheses)
    if not pairs:
        return None
    errors, words = np.zeros(len(pairs)), np.zeros(len(pairs))
    for i, (reference, hypothesis) in enumerate(pairs):
        # An empty hypothesis is all deletions (jiwer refuses empty strings).
        output = jiwer.process_words(reference, hypothesis) if hypothesis.strip() else None
        words[i] = len(reference.split())
        errors[i] = words[i] if output is None else output.substitutions + output.deletions + output.insertions
    rng = np.random.default_rng(seed)
    index = rng.integers(0, len(pairs), size=(samples, len(pairs)))
    rates = errors[index].sum(1) / words[index].sum(1)
    tail = (1 - confidence) / 2
    low, high = np.quantile(rates, [tail, 1 - tail])
    return {"wer": float(errors.sum() / words.sum()), "low": float(low), "high": float(high)}
