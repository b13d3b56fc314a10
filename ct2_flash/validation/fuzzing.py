"""Fuzzed exactness: random ``transcribe()`` options and drafters against faster-whisper.

A case is one clip, one draw of faster-whisper's options and one drafter (the shipped one, the
oracle with 25% injected errors, or a random one). The speculative model drafts every round
(no router), so the loop decides every window it can; options the loop does not implement
(``repetition_penalty``, ``no_repeat_ngram_size``, beam search) must fall back to CTranslate2
and say so. At float32 the segments must equal faster-whisper's: text, tokens, times and words
exactly; scores and probabilities within 1e-4 (docs/exactness.md).

Temperature stays 0 (one value, or a list whose thresholds are off so that no retry samples):
sampled retries draw from another random stream than CTranslate2's, so they are compared in
distribution elsewhere (``tests/test_sampling.py``), not token for token here.

``tests/test_fuzz.py`` runs a bounded number of cases; ``bench/fuzz_exactness.py`` a long run
whose result is committed.
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

PROMPTS = ("Hello there.", "The quick brown fox.", "Meeting notes, Tuesday: budget and hiring.", "Um, so, yeah")
PREFIXES = ("The", "Hello", "So")
HOTWORDS = ("fox dog", "budget", "Tuesday")
DRAFTERS = ("shipped", "oracle", "random")
# Options the loop leaves to CTranslate2 (with the reason it logs).
NOT_SPECULATIVE = ("repetition_penalty", "no_repeat_ngram_size", "beam_size")


# A multilingual model's language (None: detected) and task, and prompts in other languages.
LANGUAGES = (None, "en", "de", "fr", "es")
FOREIGN_PROMPTS = ("Guten Tag, wie geht es Ihnen?", "Bonjour à tous, merci d'être venus.", "¿Dónde está la estación?")


def random_case(rng: np.random.Generator, clips: Sequence[str], multilingual: bool = False) -> Dict[str, Any]:
    """One case: {"clip", "drafter", "options"} with options as ``transcribe()`` takes them.

    ``multilingual``: for a multilingual model, also draw the language (or detection), the
    task (transcribe or translate) and prompts in other languages."""
    options: Dict[str, Any] = {"beam_size": 5 if rng.random() < 0.05 else 1}

    def maybe(probability: float) -> bool:
        return bool(rng.random() < probability)

    if maybe(0.3):
        options["initial_prompt"] = str(rng.choice(PROMPTS))
    if maybe(0.2):
        options["prefix"] = str(rng.choice(PREFIXES))
    if maybe(0.2):
        options["hotwords"] = str(rng.choice(HOTWORDS))
    options["condition_on_previous_text"] = maybe(0.7)
    options["without_timestamps"] = maybe(0.3)
    options["word_timestamps"] = maybe(0.3)
    if options["word_timestamps"] and maybe(0.3):
        options["hallucination_silence_threshold"] = float(rng.choice([0.5, 1.0, 2.0]))
    if maybe(0.2):
        options["vad_filter"] = True
        options["vad_parameters"] = {
            "min_silence_duration_ms": int(rng.choice([100, 500, 2000])),
            "threshold": float(rng.choice([0.3, 0.5])),
        }
    elif maybe(0.15):
        options["clip_timestamps"] = [round(float(rng.uniform(0, 1.5)), 2), round(float(rng.uniform(2.0, 6.0)), 2)]
    if maybe(0.2):
        options["max_new_tokens"] = int(rng.integers(1, 30))
    if maybe(0.3):
        choices = ([-1], [], [-1, 11, 13], [262, 290])
        options["suppress_tokens"] = list(choices[int(rng.integers(len(choices)))])
    if maybe(0.2):
        options["suppress_blank"] = False
    if maybe(0.2):
        options["length_penalty"] = float(rng.choice([0.5, 0.8, 1.5, 2.0]))
    if maybe(0.08):
        options["repetition_penalty"] = 1.1
    if maybe(0.08):
        options["no_repeat_ngram_size"] = 3
    if multilingual:
        options["language"] = LANGUAGES[int(rng.integers(len(LANGUAGES)))]
        options["task"] = "translate" if maybe(0.3) else "transcribe"
        if maybe(0.3):
            options["initial_prompt"] = str(rng.choice(FOREIGN_PROMPTS))
    elif maybe(0.3):
        options["language"] = "en"
    # No sampled retry: one temperature, or a list with the thresholds that trigger it off.
    if maybe(0.5):
        options["temperature"] = 0.0
    else:
        options.update(temperature=[0.0, 0.4, 0.8], compression_ratio_threshold=None, log_prob_threshold=None)
    if maybe(0.3):
        options["no_speech_threshold"] = float(rng.choice([0.2, 0.6, 0.9]))
    return {"clip": str(rng.choice(list(clips))), "drafter": str(rng.choice(DRAFTERS)), "options": options}


def comparable(segments) -> List[Tuple]:
    """Segments as (exact part, approximate part): the text, tokens, times and words, and the
    scores and probabilities."""
    rows = []
    for s in segments:
        words = tuple((w.start, w.end, w.word) for w in s.words or ())
        rows.append(
            (
                (s.text, tuple(s.tokens), s.start, s.end, s.seek, words, s.temperature),
                (s.avg_logprob, s.no_speech_prob, s.compression_ratio, *(w.probability for w in s.words or ())),
            )
        )
    return rows


def same_segments(ours: List[Tuple], theirs: List[Tuple], tolerance: float = 1e-4) -> bool:
    """Whether two ``comparable`` lists agree: exact parts equal, the rest within ``tolerance``."""
    if len(ours) != len(theirs):
        return False
    for (exact, approx), (exact_ref, approx_ref) in zip(ours, theirs):
        if exact != exact_ref or len(approx) != len(approx_ref):
            return False
        if not np.allclose(
            np.asarray(approx, dtype=np.float64),
            np.asarray(approx_ref, dtype=np.float64),
            rtol=0,
            atol=tolerance,
            equal_nan=True,
        ):
            return False
    return True


def run_case(
    case: Dict[str, Any], flash, baseline, audio: Dict[str, np.ndarray], drafters: Dict[str, Any]
) -> Dict[str, Any]:
    """Transcribe one case with both models; returns the case with ``identical`` and how the
    calls went (speculative rows, calls left to CTranslate2)."""
    samples = audio[case["clip"]]
    segments, _ = baseline.transcribe(samples, **case["options"])
    expected = comparable(list(segments))
    flash.reset_spec_stats()
    with flash.use_drafter(drafters[case["drafter"]]):
        segments, _ = flash.transcribe(samples, **case["options"])
        got = comparable(list(segments))
    stats = flash.spec_stats
    return {
        **case,
        "identical": same_segments(got, expected),
        "segments": len(expected),
        "speculative_rows": stats.rows_in_loop,
        "fallback_calls": stats.unchanged_calls,
    }
