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

import functools
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from ct2_flash.runtime.acceptance import Acceptance, draw, greedy_accept, sample_accept
from ct2_flash.runtime.draft_length import DraftLengthPolicy
from ct2_flash.drafting.base import Drafter, DraftWindow, DecodingOptions
from ct2_flash.runtime.logit_rules import LogitRules, sampling_distribution
from ct2_flash.runtime.stats import SpecStats
from ct2_flash.runtime.target import PromptLayout, TargetRuntime


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


def _charged(field_name: str) -> Callable:
    """Decorate a ``SpeculativeDecoder`` method so that its wall time adds to ``stats.<field_name>``:
    the one place the loop's time split is measured."""
    def decorate(method: Callable) -> Callable:
        @functools.wraps(method)
        def charged(self, *args, **kwargs):
            started = time.perf_counter()
            try:
                return method(self, *args, **kwargs)
            finally:
                setattr(self.stats, field_name, getattr(self.stats, field_name) + time.perf_counter() - started)
        return charged
    return decorate


@dataclass(frozen=True)
class _Draft:
    """What a round verifies: drafts [n], the drafter's log-probability of each (or fewer, when
    it gives none), and under sampling the distributions they were drawn from [n, vocab]."""

    tokens: Sequence[int] = ()
    confidences: Sequence[float] = ()
    probs: Optional[np.ndarray] = None


class SpeculativeDecoder:
    """Runs the loop for one target and one drafter.

    Args:
        runtime: the target.
        drafter: the drafter (checked against the target's vocabulary by the caller).
        num_draft_tokens: K, the most tokens proposed per round (>= 1).
        stats: counters to update.
        adaptive: stop drafting for a stretch of a window once the ``DraftGovernor`` finds it
            slower than plain steps, then probe it again (timing-dependent, so off by default;
            the model adapter turns it on).
        guard_margin: a row of a multi-token pass whose choice is closer than this (in logits,
            see ``LogitRules.choose``) to going another way is decided again by a single-token
            pass, which is what greedy ``generate()`` computes. Multi-token rows are not the
            same computation as single steps (at int8 they move by up to ~1 logit), so this
            trades a few extra passes for identity; 0 turns it off. A sequence gives one margin
            per row of the block (row 0 follows the anchor; the last one serves longer blocks),
            as ``bench/guard_margin.py`` measures them. Greedy decoding only: under sampling a
            row's distribution is used as verified.
        seed: seeds the random choices of sampled decoding (None: fresh entropy). The n-th
            sampled ``decode`` of a decoder draws its uniforms from (seed, n), one pair per
            output position, and a seeded sampled call drafts a fixed K every round (no
            timing-driven lengths), so a seeded decoder with the same drafter repeats its
            outputs call for call on the same machine. Another drafter samples from the same
            distribution, but not always the same tokens: its passes group other rows, and
            where multi-token float32 rows are not bit-identical to single steps (CPUs whose
            GEMMs sum in another order for another row count) a near-tie can go another way.
            Greedy decoding draws nothing.
        draw_drafts: under sampling, draw the drafts from the drafter's own distribution (its
            logits under the target's logit rules, temperature and top-k) and judge them by
            the rejection rule, where the drafter gives logits; False proposes its most likely
            tokens outright (each kept with probability p(draft), the target's draw decides).
            A seeded run then depends on the drafter's distribution as well as the seed.
    """

    def __init__(self, runtime: TargetRuntime, drafter: Drafter, num_draft_tokens: int, stats: SpecStats,
                 adaptive: bool = False, guard_margin: Union[float, Sequence[float]] = 0.0, seed: Optional[int] = None,
                 draw_drafts: bool = True):
        if num_draft_tokens < 1:
            raise ValueError("num_draft_tokens must be >= 1")
        self.seeded = seed is not None
        self.draw_drafts = draw_drafts
        self._entropy = np.random.SeedSequence(seed).entropy
        self._sampled_calls = 0
        self.guard_margin = guard_margin
        self.runtime = runtime
        self.drafter = drafter
        self.num_draft_tokens = num_draft_tokens
        self.stats = stats
        self.adaptive = adaptive
        # Measured cost of a single-token target pass (rounds with nothing proposed and plain
        # steps are such passes); None until one has run.
        self.step_seconds: Optional[float] = None
        # Drafts per round from the drafter's confidence and the measured verification cost
        # (only with adaptive: otherwise every proposed token is verified).
        self.lengths = DraftLengthPolicy()

    @property
    def guard_margin(self) -> Union[float, Tuple[float, ...]]:
        return self._guard_margin

    @guard_margin.setter
    def guard_margin(self, value: Union[float, Sequence[float]]) -> None:
        margins = np.atleast_1d(np.asarray(value, dtype=np.float64))
        if margins.ndim != 1 or margins.size == 0 or not np.all(margins >= 0.0):
            raise ValueError(f"guard_margin must be >= 0 (a number or one per block row), got {value!r}")
        self._guard_margin = float(margins[0]) if np.ndim(value) == 0 else tuple(float(m) for m in margins)
        self._guard_rows = margins  # [rows] (the last serves longer blocks)

    @contextmanager
    def drafting(self, drafter: Drafter, adaptive: bool = False) -> Iterator[Drafter]:
        """Decode with ``drafter`` (and ``adaptive``) inside the block, then restore both."""
        saved = (self.drafter, self.adaptive)
        self.drafter, self.adaptive = drafter, adaptive
        try:
            yield drafter
        finally:
            self.drafter, self.adaptive = saved

    def rules_for(self, prompt: Sequence[int], options: DecodingOptions) -> LogitRules:
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

    def decode(self, encoder_output, prompt: Sequence[int], options: DecodingOptions,
               audio_frames: Optional[int] = None) -> DecodeResult:
        """Decode one window, greedy or sampled as ``options`` say (one hypothesis).

        Args:
            encoder_output: StorageView [1, frames, d_model].
            prompt: the full prompt.
            options: decoding options of the call.
            audio_frames: encoder frames that hold audio (the rest is padding), if known;
                only the drafter uses it.
        """
        started = time.perf_counter()
        stats, special = self.stats, self.runtime.special
        spent_before = stats.verify_seconds + stats.drafter_seconds
        prompt = [int(t) for t in prompt]
        layout = PromptLayout.of(prompt, special)
        max_steps = min(options.max_length // 2, options.max_length - layout.start_index)
        if max_steps == 0:
            raise ValueError("The maximum decoding length must be > 0")  # CTranslate2's check
        # Forced prefix tokens are part of the output and count against the budget.
        state = _Decoding(rules=self.rules_for(prompt, options), generated=prompt[layout.start_index + 1 :],
                          options=options)
        state.steps_left = max_steps - len(state.generated)
        # A seeded sampled call keeps its passes' shapes free of timings: a multi-token row
        # need not equal a single step bit for bit (float32 GEMMs may sum in another order for
        # another row count), so draft lengths chosen from measured costs could move a sample.
        state.adaptive = self.adaptive and not (options.sampling and self.seeded)
        if options.sampling:
            # [position in generated, 2]: the acceptance test's and the draw's uniform.
            rng = np.random.default_rng([self._entropy, self._sampled_calls])
            positions = len(state.generated) + max(state.steps_left, 0) + 1
            state.uniforms = rng.random((positions, 2))
            # Drafts drawn from the drafter's distribution use a stream of their own.
            state.draft_uniforms = np.random.default_rng([self._entropy, self._sampled_calls, 1]).random(positions)
            self._sampled_calls += 1

        # The engine returns its alignment attention with each pass only for drafters that use it.
        self.runtime.track_positions(self.drafter.wants_position)
        prefill = self._prefill(encoder_output, prompt)
        no_speech_prob = self.runtime.no_speech_prob(prefill.sot_logits)
        if state.steps_left <= 0:
            # The budget ends inside the prefix (or is negative, which CTranslate2 treats as
            # no step at all): nothing is sampled and the score stays 0.
            state.generated = state.generated[: max(0, max_steps)]
        else:
            state.emit([], prefill.next_logits[None].copy(), stats)  # the first token: the first anchor
            if not state.finished:
                self._begin_drafter(encoder_output, prompt, options, prefill, audio_frames)
            while not state.finished:
                self._round(state, prefill.sequence)
            stats.generate_calls += 1

        stats.other_seconds += time.perf_counter() - started - (stats.verify_seconds + stats.drafter_seconds - spent_before)
        # CTranslate2 keeps no end-of-text in hypotheses, even one forced by a prefix.
        tokens = [token for token in state.generated if token != special.eot]
        score = _normalise(state.log_prob_sum, len(tokens), options.length_penalty) if state.sampled else 0.0
        return DecodeResult(tokens=tokens, score=score, no_speech_prob=no_speech_prob)

    @_charged("drafter_seconds")
    def _begin_drafter(self, encoder_output, prompt: List[int], options: DecodingOptions, prefill,
                       audio_frames: Optional[int]) -> None:
        window = DraftWindow(encoder_output=_window_array(encoder_output), prompt=tuple(prompt), options=options,
                             eot=self.runtime.special.eot, audio_frames=audio_frames)
        self.drafter.begin(window)
        if self.drafter.needs_states:
            # History starts with the last prompt position, whose logits prefill gave.
            self.drafter.advance(self.runtime.decoder_states(prefill.next_logits[None]), prefill.sequence.length)

    def _round(self, state: "_Decoding", sequence) -> None:
        """One round: propose -> verify -> accept -> roll back -> advance.

        Timing and counters live in the charged helpers (``_charged``), not in the round.
        """
        started, spent = time.perf_counter(), (self.stats.drafter_seconds, self.stats.verify_seconds)
        cache_length, emitted_before = sequence.length, len(state.generated)
        if not state.drafting and emitted_before >= state.resume_at:
            self._resume_drafting(state, cache_length)
        draft = self._propose(state)
        logits = self._verify(sequence, [state.generated[-1], *draft.tokens])  # [1 + n, vocab]
        # The drafter's states come from the raw rows; the logit rules then edit them in place.
        columns = self.runtime.state_columns(logits) if self.drafter.needs_states else None
        outcome = state.emit(draft.tokens, logits, self.stats, self._guard_rows, draft.probs)
        # The cache keeps the anchor and the accepted drafts; after an unsure row the last
        # accepted draft (or, with none, the anchor itself) is the next anchor, so it leaves
        # the cache and the next pass computes that row alone.
        kept = cache_length + outcome.accepted + (0 if outcome.unsure else 1)
        self._rollback(sequence, kept)
        state.single_pass_next = outcome.unsure
        self._record(draft, outcome, self.stats.verify_seconds - spent[1])
        if not state.finished:
            self._advance(state, sequence, columns, kept - cache_length, min(outcome.accepted, len(draft.tokens)))
            self._judge(state, len(state.generated) - emitted_before, started, spent)

    @_charged("verify_seconds")
    def _prefill(self, encoder_output, prompt: List[int]):
        self.stats.target_calls += 1
        return self.runtime.start(encoder_output, prompt)

    @_charged("verify_seconds")
    def _verify(self, sequence, tokens: List[int]) -> np.ndarray:
        self.stats.target_calls += 1
        return sequence.verify(tokens)

    @_charged("verify_seconds")
    def _rollback(self, sequence, kept: int) -> None:
        """Cut the target's cache back to ``kept`` positions: the engine's work, so its time
        counts with the verification that made the rows it drops."""
        sequence.rollback(kept)

    @_charged("drafter_seconds")
    def _propose(self, state: "_Decoding") -> "_Draft":
        """The round's drafts: none while drafting is paused or an unsure row waits for its
        single-token pass; otherwise up to K (fewer when the budget ends or, adaptive, when
        more would not pay: ``DraftLengthPolicy`` chooses how many rows the drafter computes,
        then how many of its drafts are verified), drawn from the drafter's distribution under
        sampling."""
        # steps_left tokens may still be emitted; keep one for the recovered/bonus token.
        count = min(self.num_draft_tokens, state.steps_left - 1) if state.drafting else 0
        if count <= 0 or state.single_pass_next:
            return _Draft()
        if state.adaptive and self.drafter.proposes_prefixes:
            # The proposal's cost grows with its rows: ask only for those likely to pay.
            count = self.lengths.rows(count)
        started = time.perf_counter()
        proposal = self.drafter.propose(state.generated, count)
        self.lengths.observe_proposal(count, time.perf_counter() - started)
        self.stats.drafted_rows += count
        drafts, confidences = proposal.tokens[:count], proposal.log_probs[:count]
        probs = proposal.probs
        if state.adaptive and len(confidences) == len(drafts):
            # Verify as many as pay for their rows (the proposal itself is paid already).
            count = self.lengths.choose(confidences)
            drafts, confidences = drafts[:count], confidences[:count]
        if state.options.sampling and self.draw_drafts and proposal.logits is not None and drafts:
            drafts, probs = state.draw_drafts(proposal, len(drafts))
            confidences = confidences[: len(drafts)]
            self.stats.drawn_rounds += 1
        self.stats.draft_rounds += 1
        return _Draft(tokens=drafts, confidences=confidences, probs=probs)

    def _record(self, draft: "_Draft", outcome: Acceptance, verify_seconds: float) -> None:
        """Counters of one verified round, and what the draft-length policy learns from it."""
        stats = self.stats
        if not draft.tokens:
            self._observe_step(verify_seconds)
        stats.record_round(len(draft.tokens), outcome.accepted)
        stats.rows_rechecked += int(outcome.unsure)
        rejected = outcome.accepted < len(draft.tokens) and not outcome.unsure
        confidences = draft.confidences if len(draft.confidences) == len(draft.tokens) else None
        self.lengths.observe(len(draft.tokens), outcome.accepted, rejected, verify_seconds, confidences)
        if confidences is not None:
            stats.record_confidences(confidences, outcome.accepted, rejected)

    @_charged("drafter_seconds")
    def _advance(self, state: "_Decoding", sequence, columns: Optional[np.ndarray], kept_rows: int,
                 next_anchor_row: int) -> None:
        """Hand the drafter what the round kept: where the target reads now (the attention
        peak of the row that predicted the next anchor) and the kept rows' states."""
        if sequence.attention_peaks is not None:
            self.drafter.observe_position(int(sequence.attention_peaks[next_anchor_row]))
        if state.drafting:
            if kept_rows > 0:
                states = self.runtime.states_from_columns(columns[:kept_rows]) if columns is not None else None
                self.drafter.advance(states, sequence.length)
        elif self.drafter.needs_states and state.resume_at < math.inf:
            state.pending_states.append(self.runtime.states_from_columns(columns[:1]))

    def _judge(self, state: "_Decoding", emitted: int, started: float, spent: Tuple[float, float]) -> None:
        """Record a drafting round with the window's governor; stop drafting for a stretch
        when it measures slower than plain steps (adaptive only)."""
        if not state.drafting:
            return
        state.governor.record(emitted, time.perf_counter() - started, self.stats.drafter_seconds - spent[0],
                              self.stats.verify_seconds - spent[1])
        if state.adaptive and not state.governor.pays(self.step_seconds):
            # Plain steps for a while; the drafter's history is kept complete so that a
            # later stretch of the window, where drafting may pay, can be probed again.
            state.drafting = False
            state.resume_at = len(state.generated) + RESUME_AFTER_TOKENS
            self.stats.windows_drafting_stopped += 1

    def _observe_step(self, seconds: float) -> None:
        """Fold a single-token pass into ``step_seconds`` (an average over recent ones, across
        windows: one pass alone is noisy)."""
        self.step_seconds = seconds if self.step_seconds is None else 0.9 * self.step_seconds + 0.1 * seconds

    @_charged("drafter_seconds")
    def _resume_drafting(self, state: "_Decoding", cache_length: int) -> None:
        """Hand the drafter the states of the plain steps and judge drafting afresh."""
        states = np.concatenate(state.pending_states) if state.pending_states else None
        self.drafter.advance(states, cache_length)
        state.pending_states = []
        state.governor = DraftGovernor()
        state.drafting = True
        state.resume_at = math.inf
        self.stats.drafting_resumed += 1


# After drafting stopped in a window, plain steps run for this many tokens before the governor
# probes drafting again (a window's later speech may suit the drafter better than its start;
# a probe that fails costs ~3 rounds' worth of overhead, a few percent of the stretch).
RESUME_AFTER_TOKENS = 32

# Until a single-token pass has been timed, a plain step is taken to cost this fraction of a
# 9-token verification (measured with 2 CTranslate2 threads on tiny.en: 6.1 / 11.0 ms at int8,
# 7.7 / 14.8 at float32; with one thread the ratio is nearer 0.8).
STEP_OVER_VERIFY = 0.55


@dataclass
class DraftGovernor:
    """Decides whether drafting pays in the current window.

    After ``min_rounds`` drafting rounds it compares their measured time per emitted token
    (drafter + verification + bookkeeping) with what a plain step would cost: the measured
    single-token pass (or, before one was timed, the mean round's verification scaled by
    ``STEP_OVER_VERIFY``) plus the same bookkeeping. Drafting that does not pay is stopped;
    the loop probes it again ``RESUME_AFTER_TOKENS`` later with a fresh governor. The output
    is the same either way.
    """

    min_rounds: int = 3
    rounds: int = 0
    emitted: int = 0
    round_seconds: float = 0.0
    drafter_seconds: float = 0.0
    verify_seconds: float = 0.0

    def record(self, emitted: int, round_seconds: float, drafter_seconds: float, verify_seconds: float) -> None:
        self.rounds += 1
        self.emitted += emitted
        self.round_seconds += round_seconds
        self.drafter_seconds += drafter_seconds
        self.verify_seconds += verify_seconds

    def pays(self, step_seconds: Optional[float] = None) -> bool:
        """Whether drafting is at least as fast per token as plain steps.

        Args:
            step_seconds: measured time of a single-token target pass, if known.
        """
        if self.rounds < self.min_rounds:
            return True
        if self.emitted == 0:
            return False
        bookkeeping = (self.round_seconds - self.drafter_seconds - self.verify_seconds) / self.rounds
        if step_seconds is None:
            step_seconds = STEP_OVER_VERIFY * self.verify_seconds / self.rounds
        plain_step = step_seconds + bookkeeping
        return self.round_seconds / self.emitted <= plain_step


@dataclass
class _Decoding:
    """The mutable state of one decoded window."""

    rules: LogitRules
    generated: List[int]  # forced prefix, then sampled tokens; the last one is the anchor
    options: DecodingOptions = field(default_factory=DecodingOptions)
    uniforms: Optional[np.ndarray] = None  # [positions, 2] under sampling (see SpeculativeDecoder)
    draft_uniforms: Optional[np.ndarray] = None  # [positions] for drafts drawn from the drafter
    steps_left: int = 0
    adaptive: bool = False  # draft lengths and the governor follow measured costs
    log_prob_sum: float = 0.0
    sampled: bool = False
    drafting: bool = True
    governor: DraftGovernor = field(default_factory=DraftGovernor)
    resume_at: float = math.inf  # len(generated) at which stopped drafting is probed again
    single_pass_next: bool = False  # the next round verifies the anchor alone (see guard_margin)
    pending_states: List[np.ndarray] = field(default_factory=list)  # [1, d] per plain step

    @property
    def finished(self) -> bool:
        return self.steps_left <= 0 or (self.sampled and self.generated[-1] == self.rules.special.eot)

    def draw_drafts(self, proposal, count: int) -> Tuple[List[int], Optional[np.ndarray]]:
        """Draw up to ``count`` drafts from the drafter's distribution q at each position.

        Each row of the proposal's logits is scattered into the whole vocabulary (tokens off
        the drafter's shortlist get none), edited by the target's logit rules given the tokens
        before it, drafts included, and scaled by the temperature and top-k of the call, so
        that the drafter never proposes what the target rules out. Stops early at a row the
        rules leave empty or after an end-of-text.

        Returns:
            the drafts [n'] and their distributions [n', vocab] (None when n' = 0).
        """
        options, special = self.options, self.rules.special
        start, vocabulary = len(self.generated), proposal.vocabulary
        rows = np.full((count, special.vocab_size), -np.inf, dtype=np.float32)
        rows[:, vocabulary] = proposal.logits[:count]
        drafts: List[int] = []
        probs = np.zeros((count, special.vocab_size))
        for j in range(count):
            self.rules.apply(rows[j], [*self.generated, *drafts])
            # q lives on the shortlist: softmax and draw over its columns only.
            short = rows[j, vocabulary]
            if not np.isfinite(short.max()):
                break
            q = sampling_distribution(short, options.sampling_temperature, options.sampling_topk)
            drafts.append(int(vocabulary[draw(q, float(self.draft_uniforms[start + j]))]))
            probs[j, vocabulary] = q
            if drafts[-1] == special.eot:
                break
        return drafts, (probs[: len(drafts)] if drafts else None)

    def emit(self, drafts: Sequence[int], logits: np.ndarray, stats: SpecStats,
             guard_margin: Optional[np.ndarray] = None, draft_probs: Optional[np.ndarray] = None) -> Acceptance:
        """Accept drafts against the target's rows and append what the round produces.

        Args:
            drafts: [n] draft tokens (empty for a plain step).
            logits: [n + 1, vocab] raw target rows (row j follows the anchor and j drafts);
                edited in place by the logit rules.
            guard_margin: [rows] with drafts, row j decided by less than guard_margin[j] (the
                last entry for rows beyond) is left unsure (its single-token pass will count
                its log-probability); None: no guard. Greedy only.
            draft_probs: [n, vocab] under sampling, the distributions the drafts were drawn
                from; None: the drafter proposed them outright.
        """
        guard_margin = np.zeros(1) if guard_margin is None else guard_margin
        # Greedy acceptance reads rows only up to the first mismatch: the rules may stop there.
        choice = self.rules.choose_block(logits, self.generated, drafts, until_mismatch=not self.options.sampling)
        if self.options.sampling:
            options, start = self.options, len(self.generated)
            outcome = sample_accept(
                drafts,
                lambda row: choice.distribution(row, options.sampling_temperature, options.sampling_topk),
                lambda row: None if draft_probs is None else draft_probs[row],
                lambda row: self.uniforms[start + row],
                self.rules.special.eot,
            )
            return self._append(drafts, outcome, choice, stats)
        # Margins cost another pass over the rows, so only the rows acceptance reads get them:
        # up to the first mismatch.
        judged = min(len(drafts), len(choice.tokens))  # an accepted end-of-text ends the rows read
        mismatches = np.flatnonzero(choice.tokens[:judged] != np.asarray(drafts[:judged], dtype=np.int64))
        used = min(1 + (mismatches[0] if mismatches.size else judged), len(choice.tokens))
        guard = guard_margin[np.minimum(np.arange(used), guard_margin.size - 1)]
        margins = choice.margins(used) if drafts and guard.max() > 0 else None
        outcome = greedy_accept(
            drafts,
            lambda row: None if margins is not None and margins[row] < guard[row] else int(choice.tokens[row]),
            self.rules.special.eot,
        )
        return self._append(drafts, outcome, choice, stats)

    def _append(self, drafts: Sequence[int], outcome: Acceptance, choice, stats: SpecStats) -> Acceptance:
        """Append the round's tokens and count their log-probabilities in the score."""
        emitted = list(drafts[: outcome.accepted])
        if outcome.next_token is not None:
            emitted.append(outcome.next_token)
        self.generated.extend(emitted)
        # Rows 0 .. emitted - 1 gave the emitted tokens (an accepted end-of-text is its own row).
        self.log_prob_sum += float(np.sum(choice.log_probs(emitted), dtype=np.float64)) if emitted else 0.0
        self.steps_left -= len(emitted)
        self.sampled = True
        stats.emitted += len(emitted)
        return outcome


def _normalise(log_prob_sum: float, length: int, length_penalty: float) -> float:
    """CTranslate2's ``finalize_hypothesis_score``, with C++ float division by zero."""
    if length:
        denominator = math.pow(length, length_penalty)
    else:  # C++: pow(0, p) is 1 for p == 0, 0 for p > 0 and inf for p < 0
        denominator = 1.0 if length_penalty == 0 else (0.0 if length_penalty > 0 else math.inf)
    if denominator == 0:
        return -math.inf if log_prob_sum < 0 else (math.nan if log_prob_sum == 0 else math.inf)
    return log_prob_sum / denominator


def _window_array(encoder_output) -> np.ndarray:
    """[1, frames, d_model] StorageView -> [frames, d_model] float32 view (no copy on CPU)."""
    return np.asarray(encoder_output)[0]
