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

import dataclasses
import logging
import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from ct2_flash.drafting.base import Drafter, DraftWindow, Proposal
from ct2_flash.loop import draft_pause, row_scores
from ct2_flash.loop.acceptance import GreedyRule, RoundOutcome, SamplingRule
from ct2_flash.loop.clock import RoundClock, TimedDrafter, TimedTarget, call_bookkeeping, timed_prefill
from ct2_flash.loop.draft_lengths import MAX_OFFERED, DraftLengths
from ct2_flash.loop.drafts import Draft, DrawnDrafts, ProposedDrafts
from ct2_flash.loop.guard import Guard
from ct2_flash.loop.logit_rules import LogitRules
from ct2_flash.loop.options import DecodingOptions
from ct2_flash.loop.stats import SpecStats
from ct2_flash.loop.target import PromptLayout, TargetRuntime, host_array, on_device_of

logger = logging.getLogger("ct2_flash")

# Encoder frames the once-per-process score check (``confirm_score_isa``) decodes its row over.
CONFIRM_FRAMES = 16


def check_num_draft_tokens(num_draft_tokens: int) -> None:
    """K must be an int >= 1 (ValueError otherwise): checked wherever K is given, before a
    drafter is at hand too (``ct2_flash.install``)."""
    if isinstance(num_draft_tokens, bool) or not isinstance(num_draft_tokens, int) or num_draft_tokens < 1:
        raise ValueError(f"num_draft_tokens must be an int >= 1, got {num_draft_tokens!r}")


def checked_draft_count(drafter: Drafter, vocab_size: int, num_draft_tokens: int) -> int:
    """The one check of a drafter for a target, wherever one is set (the constructor,
    ``use_drafter``): K, the drafts per round that will be asked of it.

    Raises:
        ValueError: the drafter was built for another vocabulary, or K < 1.
    Returns:
        ``num_draft_tokens``, or what the drafter proposes at most where that is fewer (with a
        warning): K changes the speed, never the output, so a default K larger than a drafter
        trained for fewer is not an error.
    """
    if drafter.vocab_size is not None and drafter.vocab_size != vocab_size:
        raise ValueError(
            f"the drafter was built for a vocabulary of {drafter.vocab_size} tokens, the model has "
            f"{vocab_size}: use a drafter trained for this model"
        )
    check_num_draft_tokens(num_draft_tokens)
    most = getattr(drafter, "num_draft_tokens", None)
    if most is not None and num_draft_tokens > most:
        logger.warning(
            "ct2-flash: num_draft_tokens=%d but the drafter proposes at most %d per round; using %d",
            num_draft_tokens,
            most,
            most,
        )
        return most
    return num_draft_tokens


@dataclass(frozen=True)
class Adaptive:
    """Which of the loop's timing-driven choices are on; the tokens are the same whatever they
    are. ``adaptive=True`` means all of them, ``False`` none (every call drafts every round and
    verifies every proposed token); a benchmark that wants some passes one of these.

    Attributes:
        route_calls: each call goes the way measured faster, the loop or CTranslate2's
            ``generate()`` (``routing.CallRouter``; the model adapter asks it).
        pause_drafting: drafting pauses for a stretch of a window while it measures slower
            than plain steps, then is probed again (``draft_pause.DraftPause``).
        draft_lengths: the rows asked of the drafter and the drafts verified per round follow
            measured costs (``draft_lengths.DraftLengths``); off: K rows, all verified.
    """

    route_calls: bool = True
    pause_drafting: bool = True
    draft_lengths: bool = True

    @classmethod
    def of(cls, value: Union[bool, "Adaptive"]) -> "Adaptive":
        """``value`` as an Adaptive (True: all on, False: all off), checked once."""
        if isinstance(value, Adaptive):
            return value
        if not isinstance(value, bool):
            raise TypeError(f"adaptive must be True, False or a ct2_flash.Adaptive, not {value!r}")
        return cls(value, value, value)


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
        drafter: the drafter (``checked_draft_count``: its vocabulary must be the target's).
        num_draft_tokens: K, the most tokens proposed per round (>= 1; more than the drafter
            proposes is clamped to that, with a warning).
        stats: counters to update.
        adaptive: the timing-driven choices (``Adaptive``; True: all, False: none): pausing
            drafting in a window the ``DraftPause`` finds slower than plain steps, draft
            lengths from measured costs, and the adapter's per-call routing (off by default
            here; the model adapter turns them on).
        guard_margin: a row of a multi-token pass whose choice is closer than this (in logits,
            see ``LogitRules.choose``) to going another way is decided again by a single-token
            pass, which is what greedy ``generate()`` computes (``guard.Guard``).
            Multi-token rows are not the same computation as single steps (at int8 they move by
            up to ~1 logit), so this trades a few extra passes for identity; 0 turns it off. A
            sequence gives one margin per row of the block (row 0 follows the anchor; the last
            one serves longer blocks). Greedy decoding only: under sampling a row's
            distribution is used as verified.
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

    def __init__(
        self,
        runtime: TargetRuntime,
        drafter: Drafter,
        num_draft_tokens: int,
        stats: SpecStats,
        adaptive: Union[bool, Adaptive] = False,
        guard_margin: Union[float, Sequence[float]] = 0.0,
        seed: Optional[int] = None,
        draw_drafts: bool = True,
    ):
        num_draft_tokens = checked_draft_count(drafter, runtime.special.vocab_size, num_draft_tokens)
        margins = np.atleast_1d(np.asarray(guard_margin, dtype=np.float64))
        if margins.ndim != 1 or margins.size == 0 or not np.all(margins >= 0.0):
            raise ValueError(f"guard_margin must be >= 0 (a number or one per block row), got {guard_margin!r}")
        self._guard_margin = float(margins[0]) if np.ndim(guard_margin) == 0 else tuple(float(m) for m in margins)
        self._guard_rows = margins  # [rows] (the last serves longer blocks)
        self.seeded = seed is not None
        self.draw_drafts = draw_drafts
        self._entropy = np.random.SeedSequence(seed).entropy
        self._sampled_calls = 0
        self.runtime = runtime
        self.drafter = drafter
        self.num_draft_tokens = num_draft_tokens
        self.stats = stats
        self.adaptive = Adaptive.of(adaptive)
        # Measured cost of a single-token target pass (rounds with nothing proposed and plain
        # steps are such passes); None until one has run.
        self.step_seconds: Optional[float] = None
        # Drafts per round from the drafter's confidence and the measured verification cost
        # (only with adaptive: otherwise every proposed token is verified).
        self.lengths = DraftLengths()

    @property
    def guard_margin(self) -> Union[float, Tuple[float, ...]]:
        """The guard margin given to the constructor (a number, or one per block row)."""
        return self._guard_margin

    @contextmanager
    def use_drafter(
        self,
        drafter: Drafter,
        adaptive: Union[bool, Adaptive] = False,
        num_draft_tokens: Optional[int] = None,
        lengths: Optional[DraftLengths] = None,
    ) -> Iterator[Drafter]:
        """Decode with ``drafter`` (and ``adaptive``, K = ``num_draft_tokens`` and the
        draft lengths ``lengths``, where given) inside the block, then restore them all:
        the one way to swap a drafter in. Checked as the constructor checks
        (``checked_draft_count``).

        Raises:
            ValueError: the drafter was built for another vocabulary, or K < 1.
        """
        count = checked_draft_count(
            drafter,
            self.runtime.special.vocab_size,
            self.num_draft_tokens if num_draft_tokens is None else num_draft_tokens,
        )
        chosen = (drafter, Adaptive.of(adaptive), count, self.lengths if lengths is None else lengths)
        saved = (self.drafter, self.adaptive, self.num_draft_tokens, self.lengths)
        self.drafter, self.adaptive, self.num_draft_tokens, self.lengths = chosen
        try:
            yield drafter
        finally:
            self.drafter, self.adaptive, self.num_draft_tokens, self.lengths = saved

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

    def confirm_score_isa(self, encoder_output, prompt: Sequence[int]) -> None:
        """Check, once per process, that the loop scores rows as the engine does
        (``row_scores.confirm_isa``): the first step after ``prompt``'s start tokens (its
        previous text and forced prefix left out) on this window, scored by ``generate()`` and
        by the loop's rules. One prefill and one ``generate()`` step; meaningful where the loop's
        rows are single steps' (float32).

        Args:
            encoder_output: StorageView [1, frames, d_model].
            prompt: a prompt of the call.
        """
        if row_scores.isa_confirmed():
            return
        special = self.runtime.special
        layout = PromptLayout.of(prompt, special)
        start = [int(t) for t in prompt[layout.sot_index : layout.start_index + 1]]
        # The window's first frames: a row of real logits costs both sides a fraction of the
        # whole window's cross-attention, and any row tells how the engine scores.
        encoder_output = on_device_of(host_array(encoder_output)[:, :CONFIRM_FRAMES], encoder_output)
        try:
            # CTranslate2 runs min(max_length // 2, max_length - start) steps: this is one.
            result = self.runtime.model.generate(
                encoder_output, [start], beam_size=1, max_length=max(2, len(start)), return_scores=True
            )[0]
            chosen = result.sequences_ids[0][:1] or [special.eot]  # end of text: scored, not returned
            block = self.rules_for(start, DecodingOptions()).choose_block(
                self.runtime.start(encoder_output, start).next_logits[None], [], []
            )
        except Exception as error:  # a check must never cost the user's call
            row_scores.skip_confirmation(f"{type(error).__name__}: {error}")
            return
        if list(block.tokens[:1]) != chosen:  # not one row scored by both: no comparison
            row_scores.skip_confirmation(f"generate() chose token {chosen[0]}, the loop {int(block.tokens[0])}")
            return
        row_scores.confirm_isa(block.edited[:1], chosen, [result.scores[0]])

    def decode(
        self, encoder_output, prompt: Sequence[int], options: DecodingOptions, audio_frames: Optional[int] = None
    ) -> DecodeResult:
        """Decode one window, greedy or sampled as ``options`` say (one hypothesis).

        Args:
            encoder_output: StorageView [1, frames, d_model].
            prompt: the full prompt.
            options: decoding options of the call.
            audio_frames: encoder frames that hold audio (the rest is padding), if known;
                only the drafter uses it.
        """
        with call_bookkeeping(self.stats):
            return self._decode(encoder_output, [int(t) for t in prompt], options, audio_frames)

    def _decode(
        self, encoder_output, prompt: List[int], options: DecodingOptions, audio_frames: Optional[int]
    ) -> DecodeResult:
        clock, stats, special = RoundClock(), self.stats, self.runtime.special
        layout = PromptLayout.of(prompt, special)
        max_steps = layout.max_steps(options.max_length)
        if max_steps == 0:
            raise ValueError("The maximum decoding length must be > 0")  # CTranslate2's check
        # Forced prefix tokens are part of the output and count against the budget.
        state = _Decoding(rules=self.rules_for(prompt, options), generated=prompt[layout.start_index + 1 :])
        state.steps_left = max_steps - len(state.generated)
        # A seeded sampled call keeps its passes' shapes free of timings: a multi-token row
        # need not equal a single step bit for bit (float32 GEMMs may sum in another order for
        # another row count), so draft lengths chosen from measured costs could move a sample.
        fixed = options.sampling and self.seeded
        state.lengths = self.adaptive.draft_lengths and not fixed
        state.pausing = self.adaptive.pause_drafting and not fixed
        self._strategies(state, options, len(state.generated) + max(state.steps_left, 0) + 1)

        # The engine returns its alignment attention with each pass only for drafters that use it.
        self.runtime.track_positions(self.drafter.wants_position)
        prefill, target = timed_prefill(self.runtime, encoder_output, prompt, stats, clock)
        drafter = TimedDrafter(self.drafter, self.runtime, stats, clock)
        no_speech_prob = self.runtime.no_speech_prob(prefill.sot_logits)
        if state.steps_left <= 0:
            # The budget ends inside the prefix (or is negative, which CTranslate2 treats as
            # no step at all): nothing is sampled and the score stays 0.
            state.generated = state.generated[: max(0, max_steps)]
        else:
            first = state.accept(Draft(), prefill.next_logits[None].copy())  # the first token: the first anchor
            stats.emitted += first.emitted
            if not state.finished:
                window = DraftWindow(
                    encoder_output=_window_array(encoder_output),
                    prompt=tuple(prompt),
                    options=options,
                    eot=special.eot,
                    audio_frames=audio_frames,
                )
                drafter.begin(window, prefill.next_logits, target.length)
            while not state.finished:
                clock.start()
                draft, outcome = self._round(state, target, drafter)
                self._learn(state, draft, outcome, clock)
            stats.rows_in_loop += 1
        # CTranslate2 keeps no end-of-text in hypotheses, even one forced by a prefix.
        tokens = [token for token in state.generated if token != special.eot]
        score = _normalise(state.log_prob_sum, len(tokens), options.length_penalty) if state.chose_token else 0.0
        return DecodeResult(tokens=tokens, score=score, no_speech_prob=no_speech_prob)

    def _strategies(self, state: "_Decoding", options: DecodingOptions, positions: int) -> None:
        """The call's guard, acceptance and drafts: greedy acceptance with the guard and the
        drafts as proposed, or sampling with this call's uniforms, its drafts drawn from the
        drafter's distribution where it gives one (``draw_drafts``)."""
        eot = self.runtime.special.eot
        if not options.sampling:
            state.guard = Guard(self._guard_rows)
            state.rule, state.drafts = GreedyRule(state.guard, eot), ProposedDrafts()
            return
        state.guard = Guard(np.zeros(1))  # a sampled row's distribution is used as verified
        # [position in generated, 2]: the acceptance test's and the draw's uniform; drafts
        # drawn from the drafter's distribution use a stream of their own.
        uniforms = np.random.default_rng([self._entropy, self._sampled_calls]).random((positions, 2))
        draft_uniforms = np.random.default_rng([self._entropy, self._sampled_calls, 1]).random(positions)
        self._sampled_calls += 1
        state.rule = SamplingRule(options, uniforms, eot)
        state.drafts = DrawnDrafts(options, draft_uniforms) if self.draw_drafts else ProposedDrafts()

    def _round(self, state: "_Decoding", target: TimedTarget, drafter: TimedDrafter) -> Tuple[Draft, RoundOutcome]:
        """One round: propose -> verify -> accept -> roll back -> advance."""
        resumed = state.resumes_drafting()
        if resumed:
            self._resume_drafting(state, drafter, target.length)
        draft = self._propose(state, drafter)
        if resumed:
            draft = dataclasses.replace(draft, resumed=True)
        cache_length = target.length
        logits = target.verify([state.generated[-1], *draft.tokens])  # [1 + n, vocab]
        # The drafter's states come from the raw rows; the logit rules then edit them in place.
        columns = self.runtime.state_columns(logits) if drafter.needs_states else None
        outcome = state.accept(draft, logits)
        kept = state.guard.cache_rows(outcome)
        target.rollback(cache_length + kept)
        if not state.finished:
            self._advance(state, target, drafter, columns, kept, min(outcome.accepted, len(draft.tokens)))
        return draft, outcome

    def _propose(self, state: "_Decoding", drafter: TimedDrafter) -> Draft:
        """The round's drafts: none while drafting is paused or an unsure row waits for its
        single-token pass; the drafter's offered tokens if it has any (up to ``MAX_OFFERED``,
        as many as pay when adaptive); otherwise up to K proposed (fewer when the budget ends
        or, adaptive, when more would not pay: ``DraftLengths`` chooses how many rows the
        drafter computes, then how many of its drafts are verified), drawn from the drafter's
        distribution under sampling."""
        # steps_left tokens may still be emitted; keep one for the recovered/bonus token.
        count = min(self.num_draft_tokens, state.steps_left - 1)
        if count <= 0 or not state.guard.allows_drafts():
            return Draft()
        # Tokens known for free (a previous hypothesis of this audio, the decode's own repeats)
        # go first, as a long block, also while the drafter's proposals are paused: they cost
        # nothing to propose.
        offered = drafter.offered(state.generated, min(MAX_OFFERED, state.steps_left - 1))
        verified = self.lengths.offered(len(offered)) if state.lengths else len(offered)
        if verified:
            tokens = tuple(offered[:verified])
            draft = state.drafts.drafts(Proposal(tokens=tokens), tokens, (), state.rules, state.generated)
            return dataclasses.replace(draft, offered=True)
        if not state.drafting:
            return Draft()
        if state.lengths and self.drafter.proposes_prefixes:
            # The proposal's cost grows with its rows: ask only for those likely to pay.
            count = self.lengths.rows(count)
        proposal = drafter.propose(state.generated, count)
        drafts, confidences = proposal.tokens[:count], proposal.log_probs[:count]
        if state.lengths and len(confidences) == len(drafts):
            # Verify as many as pay for their rows (the proposal itself is paid already).
            verified = self.lengths.choose(confidences)
            drafts, confidences = drafts[:verified], confidences[:verified]
        draft = state.drafts.drafts(proposal, drafts, confidences, state.rules, state.generated)
        return dataclasses.replace(draft, rows=count)

    def _advance(
        self,
        state: "_Decoding",
        target: TimedTarget,
        drafter: TimedDrafter,
        columns: Optional[np.ndarray],
        kept_rows: int,
        next_anchor_row: int,
    ) -> None:
        """Hand the drafter what the round kept: where the target reads now (the attention
        peak of the row that predicted the next anchor) and the kept rows' states."""
        if target.attention_peaks is not None:
            drafter.observe_position(int(target.attention_peaks[next_anchor_row]))
        if state.drafting:
            if kept_rows > 0:
                drafter.advance(columns[:kept_rows] if columns is not None else None, target.length)
        elif drafter.needs_states and state.resume_at < math.inf:
            state.pending_states.append(drafter.states_of(columns[: max(kept_rows, 1)]))

    def _resume_drafting(self, state: "_Decoding", drafter: TimedDrafter, cache_length: int) -> None:
        """Hand the drafter the states of the plain steps and judge drafting afresh."""
        states = np.concatenate(state.pending_states) if state.pending_states else None
        drafter.advance_states(states, cache_length)
        state.pending_states = []
        state.pause = draft_pause.DraftPause()
        state.drafting = True
        state.resume_at = math.inf

    def _learn(self, state: "_Decoding", draft: Draft, outcome: RoundOutcome, clock: RoundClock) -> None:
        """After a round: its counters, what ``DraftLengths`` and the guard learn from
        it, and the pause's verdict on drafting in this window."""
        stats = self.stats
        stats.emitted += outcome.emitted
        stats.drafting_resumed += int(draft.resumed)
        state.guard.after_round(outcome)
        if draft.rows:
            stats.draft_rounds += 1
            stats.drafted_rows += draft.rows
            stats.drawn_rounds += int(draft.drawn)
            self.lengths.observe_proposal(draft.rows, clock.propose_seconds)
        if not draft.tokens:
            self._observe_step(clock.verify_seconds)
        stats.record_round(len(draft.tokens), outcome.accepted)
        stats.rows_rechecked += int(outcome.unsure)
        rejected = outcome.accepted < len(draft.tokens) and not outcome.unsure
        if draft.offered:
            # Offered tokens are judged apart: their acceptance says nothing of the drafter's.
            stats.offered_rounds += 1
            stats.offered += len(draft.tokens)
            stats.offered_accepted += outcome.accepted
            stats.record_offered_end(self._offered_end(draft, outcome))
            self.lengths.observe_offered(len(draft.tokens), outcome.accepted, rejected, clock.verify_seconds)
        else:
            confidences = draft.confidences if len(draft.confidences) == len(draft.tokens) else None
            self.lengths.observe(len(draft.tokens), outcome.accepted, rejected, clock.verify_seconds, confidences)
            if confidences is not None:
                stats.record_confidences(confidences, outcome.accepted, rejected)
        if state.finished or not state.drafting:
            return
        state.pause.record(outcome.emitted, clock.elapsed, clock.drafter_seconds, clock.verify_seconds)
        if state.pausing and not state.pause.pays(self.step_seconds):
            # Plain steps for a while; the drafter's history is kept complete so that a
            # later stretch of the window, where drafting may pay, can be probed again.
            state.drafting = False
            state.resume_at = draft_pause.resume_position(len(state.generated))
            stats.windows_drafting_stopped += 1

    def _offered_end(self, draft: Draft, outcome: RoundOutcome) -> str:
        """What ended an offered round (``SpecStats.offered_ends``)."""
        if outcome.unsure:
            return "unsure"
        if outcome.accepted >= len(draft.tokens):
            return "whole block"
        begin = self.runtime.special.timestamp_begin
        chosen = outcome.next_token
        moved = draft.tokens[outcome.accepted] >= begin or (chosen is not None and chosen >= begin)
        return "timestamp" if moved else "text"

    def _observe_step(self, seconds: float) -> None:
        """Fold a single-token pass into ``step_seconds`` (an average over recent ones, across
        windows: one pass alone is noisy)."""
        self.step_seconds = seconds if self.step_seconds is None else 0.9 * self.step_seconds + 0.1 * seconds


@dataclass
class _Decoding:
    """The mutable state of one decoded window."""

    rules: LogitRules
    generated: List[int]  # forced prefix, then sampled tokens; the last one is the anchor
    rule: object = None  # GreedyRule or SamplingRule (``acceptance``)
    drafts: object = None  # ProposedDrafts or DrawnDrafts (``drafts``)
    guard: Optional[Guard] = None
    steps_left: int = 0
    lengths: bool = False  # draft lengths follow measured costs (Adaptive.draft_lengths)
    pausing: bool = False  # DraftPause may pause drafting (Adaptive.pause_drafting)
    log_prob_sum: float = 0.0
    chose_token: bool = False  # a round has added a token after the forced prefix
    drafting: bool = True
    pause: draft_pause.DraftPause = field(default_factory=draft_pause.DraftPause)
    resume_at: float = math.inf  # len(generated) at which stopped drafting is probed again
    pending_states: List[np.ndarray] = field(default_factory=list)  # [1, d] per plain step

    @property
    def finished(self) -> bool:
        return self.steps_left <= 0 or (self.chose_token and self.generated[-1] == self.rules.special.eot)

    def resumes_drafting(self) -> bool:
        """Drafting stopped in this window and its probe is due."""
        return not self.drafting and len(self.generated) >= self.resume_at

    def accept(self, draft: Draft, logits: np.ndarray) -> RoundOutcome:
        """Accept drafts against the target's rows and append what the round produces.

        Args:
            draft: what was verified after the anchor (empty for a plain step).
            logits: [n + 1, vocab] raw target rows (row j follows the anchor and j drafts);
                edited in place by the logit rules.
        """
        # Greedy acceptance reads rows only up to the first mismatch: the rules may stop there.
        choice = self.rules.choose_block(
            logits, self.generated, draft.tokens, until_mismatch=not self.rule.reads_all_rows
        )
        outcome = self.rule.accept(draft, choice, len(self.generated))
        emitted = list(draft.tokens[: outcome.accepted])
        if outcome.next_token is not None:
            emitted.append(outcome.next_token)
        self.generated.extend(emitted)
        # Rows 0 .. emitted - 1 gave the emitted tokens (an accepted end-of-text is its own row).
        self.log_prob_sum += float(np.sum(choice.log_probs(emitted), dtype=np.float64)) if emitted else 0.0
        self.steps_left -= len(emitted)
        self.chose_token = True
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
    return host_array(encoder_output)[0]
