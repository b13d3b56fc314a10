"""The one speculative decode loop: propose -> verify -> accept -> roll back -> emit.

Anchor and cache rules (Whisper-Flash, appendix A.1): the prompt's last logits give the first
token, which is the first *anchor*; emitted text always runs one token ahead of the target
cache. Before a round with anchor y_t, the target cache holds exactly the positions before t.
The round verifies ``[y_t, d_1 .. d_n]``; with cache length L and a drafts accepted, the cache
keeps L + 1 + a positions and the recovered or bonus token becomes the next anchor. With R
tokens still allowed, at most R - 1 drafts are proposed so the bonus always fits.

Budget and scores follow CTranslate2's greedy search (``src/decoding.cc``): at most
``min(max_length // 2, max_length - context)`` steps after the forced prefix, end-of-text
not kept in the tokens but counted in the score, score = sum of log-probabilities / length **
length_penalty.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np

from .acceptance import greedy_accept
from .drafting import Drafter, DraftWindow, GreedyOptions
from .logit_rules import LogitRules
from .stats import SpecStats
from .target import PromptLayout, TargetRuntime


@dataclass(frozen=True)
class DecodeResult:
    """One decoded row, as CTranslate2 would return it.

    Attributes:
        tokens: generated tokens (forced prefix included, end-of-text excluded).
        score: length-normalised sum of log-probabilities.
        no_speech_prob: probability of <|nospeech|> at the start-of-transcript position.
    """

    tokens: List[int]
    score: float
    no_speech_prob: float


class SpeculativeDecoder:
    """Runs the loop for one target and one drafter.

    Args:
        runtime: the target.
        drafter: the drafter (checked against the target's vocabulary by the caller).
        num_draft_tokens: K, the most tokens proposed per round (>= 1).
        stats: counters to update.
    """

    def __init__(self, runtime: TargetRuntime, drafter: Drafter, num_draft_tokens: int, stats: SpecStats):
        if num_draft_tokens < 1:
            raise ValueError("num_draft_tokens must be >= 1")
        self.runtime = runtime
        self.drafter = drafter
        self.num_draft_tokens = num_draft_tokens
        self.stats = stats

    def rules_for(self, prompt: Sequence[int], options: GreedyOptions) -> LogitRules:
        """The logit processor chain CTranslate2 builds for this prompt and these options."""
        special = self.runtime.special
        layout = PromptLayout.of(prompt, special)
        suppress: List[int] = []
        for token in options.suppress_tokens:
            if token == -1:
                suppress.extend(self.runtime.suppress_ids)
            elif token >= 0:
                suppress.append(token)
        return LogitRules(
            special=special,
            suppress_ids=tuple(suppress),
            suppress_begin_ids=self.runtime.suppress_ids_begin if options.suppress_blank else (),
            timestamps=prompt[layout.start_index] != special.no_timestamps,
            max_initial_timestamp_id=special.timestamp_begin + options.max_initial_timestamp_index,
            sample_begin=layout.prefix_length,
        )

    def decode(self, encoder_output, prompt: Sequence[int], options: GreedyOptions) -> DecodeResult:
        """Greedy-decode one window.

        Args:
            encoder_output: StorageView [1, frames, d_model].
            prompt: the full prompt.
            options: greedy options of the call.
        """
        started = time.perf_counter()
        stats, special = self.stats, self.runtime.special
        verify_before, drafter_before = stats.verify_seconds, stats.drafter_seconds
        prompt = [int(t) for t in prompt]
        layout = PromptLayout.of(prompt, special)
        rules = self.rules_for(prompt, options)
        generated: List[int] = prompt[layout.start_index + 1 :]  # forced prefix
        max_steps = min(options.max_length // 2, options.max_length - layout.start_index)
        if max_steps == 0:
            raise ValueError("The maximum decoding length must be > 0")  # CTranslate2's check
        # Forced prefix steps count against the budget (CTranslate2 returns the prefix).
        steps_left = max_steps - len(generated)
        log_prob_sum = 0.0

        verify_started = time.perf_counter()
        prefill = self.runtime.start(encoder_output, prompt)
        stats.verify_seconds += time.perf_counter() - verify_started
        stats.target_calls += 1
        sequence = prefill.sequence
        no_speech_prob = self.runtime.no_speech_prob(prefill.sot_logits)
        if steps_left <= 0:
            # The budget ends inside the forced prefix (or is negative, which CTranslate2
            # treats as no step at all): no sampled step, score 0.
            tokens = [token for token in generated[: max(0, max_steps)] if token != special.eot]
            stats.other_seconds += time.perf_counter() - started - (stats.verify_seconds - verify_before)
            return DecodeResult(tokens=tokens, score=0.0, no_speech_prob=no_speech_prob)

        token, log_prob = rules.choose(prefill.next_logits.copy(), generated)
        generated.append(token)
        log_prob_sum += log_prob
        steps_left -= 1
        stats.emitted += 1
        finished = token == special.eot or steps_left == 0

        if not finished:
            drafter_started = time.perf_counter()
            self.drafter.begin(
                DraftWindow(
                    encoder_output=_window_array(encoder_output),
                    prompt=tuple(prompt),
                    options=options,
                    eot=special.eot,
                )
            )
            if self.drafter.needs_states:
                # History starts with the last prompt position, whose logits prefill gave.
                self.drafter.advance(self.runtime.decoder_states(prefill.next_logits[None]), sequence.length)
            stats.drafter_seconds += time.perf_counter() - drafter_started

        while not finished:
            cache_length = sequence.length
            # steps_left tokens may still be emitted; keep one for the recovered/bonus token.
            num_tokens = min(self.num_draft_tokens, steps_left - 1)
            drafts: Sequence[int] = ()
            if num_tokens > 0:
                drafter_started = time.perf_counter()
                drafts = self.drafter.propose(generated, num_tokens).tokens[:num_tokens]
                stats.drafter_seconds += time.perf_counter() - drafter_started
                stats.draft_rounds += 1

            verify_started = time.perf_counter()
            logits = sequence.verify([generated[-1], *drafts])  # [1 + n, vocab]
            stats.verify_seconds += time.perf_counter() - verify_started
            stats.target_calls += 1

            row_log_probs: List[float] = []

            def target_token(row: int) -> int:
                # Row `row` sees the anchor and the first `row` drafts, all accepted so far.
                # A copy: the raw rows stay intact for the drafter's state recovery.
                choice, row_log_prob = rules.choose(logits[row].copy(), [*generated, *drafts[:row]])
                row_log_probs.append(row_log_prob)
                return choice

            outcome = greedy_accept(drafts, target_token, special.eot)
            stats.record_round(len(drafts), outcome.accepted)
            emitted = list(drafts[: outcome.accepted])
            if outcome.next_token is not None:
                emitted.append(outcome.next_token)
            generated.extend(emitted)
            log_prob_sum += sum(row_log_probs)
            steps_left -= len(emitted)
            stats.emitted += len(emitted)

            kept = cache_length + 1 + outcome.accepted
            sequence.rollback(kept)
            finished = generated[-1] == special.eot or steps_left == 0
            if not finished:
                drafter_started = time.perf_counter()
                states = None
                if self.drafter.needs_states:
                    states = self.runtime.decoder_states(logits[: 1 + outcome.accepted])
                self.drafter.advance(states, kept)
                stats.drafter_seconds += time.perf_counter() - drafter_started

        stats.generate_calls += 1
        # CTranslate2 keeps no end-of-text in hypotheses, even one forced by a prefix.
        tokens = [token for token in generated if token != special.eot]
        stats.other_seconds += time.perf_counter() - started - (stats.verify_seconds - verify_before) - (
            stats.drafter_seconds - drafter_before
        )
        return DecodeResult(
            tokens=tokens,
            score=_normalise(log_prob_sum, len(tokens), options.length_penalty),
            no_speech_prob=no_speech_prob,
        )


def _normalise(log_prob_sum: float, length: int, length_penalty: float) -> float:
    """CTranslate2's ``finalize_hypothesis_score`` with IEEE float division semantics."""
    denominator = math.pow(length, length_penalty) if length or length_penalty else 1.0
    if denominator == 0:
        return -math.inf if log_prob_sum < 0 else (math.nan if log_prob_sum == 0 else math.inf)
    return log_prob_sum / denominator


def _window_array(encoder_output) -> np.ndarray:
    """[1, frames, d_model] StorageView -> [frames, d_model] float32 view (no copy on CPU)."""
    return np.asarray(encoder_output)[0]
