"""Counters of the speculative loop, kept on the model (``model.spec_stats``)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Dict, List, Sequence

from ct2_flash.loop.draft_lengths import CONFIDENCE_BINS, DraftLengths

OFFERED_ENDS = ("whole block", "timestamp", "text", "unsure")


def _former_name(old: str, new: str) -> property:
    """A property under a counter's former name ``old`` that reads and writes ``new``, with a
    ``DeprecationWarning``."""

    def warn() -> None:
        warnings.warn(f"SpecStats.{old} is now SpecStats.{new}", DeprecationWarning, stacklevel=3)

    def read(stats):
        warn()
        return getattr(stats, new)

    def write(stats, value) -> None:
        warn()
        setattr(stats, new, value)

    return property(read, write)


@dataclass
class SpecStats:
    """What the speculative loop did since the last reset.

    Attributes:
        target_calls: target decoder passes (prefill counts as one, each verification as one).
        draft_rounds: rounds in which the drafter was asked for tokens.
        drawn_rounds: of those, sampled rounds whose drafts were drawn from the drafter's own
            distribution (the rejection rule with q) rather than proposed outright.
        drafted_rows: draft positions the drafter was asked for (it computes one row each).
        proposed: draft tokens sent to verification.
        accepted: draft tokens the target agreed with.
        emitted: tokens produced (accepted drafts, corrections, bonuses, first tokens).
        accepted_by_position: [K] how often the draft at position j (0-based) was accepted.
        proposed_by_position: [K] how often a draft at position j was proposed.
        encoder_seconds / drafter_seconds / verify_seconds / other_seconds: wall time split;
            verify_seconds is the engine's (its passes and its cache rollbacks), other_seconds
            the loop's own bookkeeping (logit rules, acceptance, scores, state columns).
        generate_seconds: wall time of the greedy or sampled calls decoded by CTranslate2's
            ``generate()`` instead of the loop (``rows_in_generate``), so that a time split can
            tell them from the loop's bookkeeping.
        rows_in_loop: rows of ``generate()`` calls the speculative loop decoded.
        windows_drafting_stopped: times drafting did not pay in a row and was stopped.
        drafting_resumed: times stopped drafting was probed again later in its row.
        rows_rechecked: rows of multi-token passes too close to call, decided again by a
            single-token pass (``guard_margin``).
        unchanged_calls: ``generate()`` calls passed to CTranslate2 unchanged because the loop
            does not implement them (beam search, options it does not handle).
        rows_in_generate: rows the loop could decode that CTranslate2's ``generate()`` decoded
            because the loop measured slower (``routing.CallRouter``) or was busy.
        continued_rows: one-row greedy calls sent to ``generate()`` that outgrew their audio
            (``speculative_whisper.longest_plausible``) and were finished in the loop.
        redecodes: greedy calls whose window's audio the same thread decoded before (its
            previous hypothesis is offered, ``redecodes.memory.RecentWindows``).
        offered_rounds: rounds that verified offered tokens (a previous hypothesis of the
            same audio, ``Drafter.offered``); ``offered`` of them were verified and
            ``offered_accepted`` accepted (also counted in ``proposed`` / ``accepted``).
        offered_ends: what ended each offered round (``OFFERED_ENDS``): "whole block" (every
            offered token accepted: the block's length or the hypothesis's end), "timestamp"
            (the first rejected position had a timestamp in the draft or the target's
            choice: a segment boundary that moved), "text" (a word said otherwise), "unsure"
            (a row too close to call, rechecked by a single step).
        busy_calls: calls the router sent to the loop that went to ``generate()`` because
            another thread was decoding in it.
        calibration: [K][bins] counts (judged, accepted) of draft positions by the drafter's
            confidence bin (``draft_lengths.DraftLengths.bins``), for the calibration plot;
            a position counts when every draft before it was accepted.
    """

    target_calls: int = 0
    draft_rounds: int = 0
    drawn_rounds: int = 0
    drafted_rows: int = 0
    proposed: int = 0
    accepted: int = 0
    emitted: int = 0
    accepted_by_position: List[int] = field(default_factory=list)
    proposed_by_position: List[int] = field(default_factory=list)
    encoder_seconds: float = 0.0
    drafter_seconds: float = 0.0
    verify_seconds: float = 0.0
    other_seconds: float = 0.0
    generate_seconds: float = 0.0
    rows_in_loop: int = 0
    windows_drafting_stopped: int = 0
    drafting_resumed: int = 0
    rows_rechecked: int = 0
    unchanged_calls: int = 0
    rows_in_generate: int = 0
    busy_calls: int = 0
    redecodes: int = 0
    continued_rows: int = 0
    offered_rounds: int = 0
    offered: int = 0
    offered_accepted: int = 0
    offered_ends: Dict[str, int] = field(default_factory=dict)
    calibration: List[List[List[int]]] = field(default_factory=list)

    # The names these counters had before: readable and writable for one more release, with a warning.
    generate_calls = _former_name("generate_calls", "rows_in_loop")
    generate_rows = _former_name("generate_rows", "rows_in_generate")
    fallback_calls = _former_name("fallback_calls", "unchanged_calls")

    @property
    def acceptance_rate(self) -> float:
        """accepted / proposed (0 when nothing was proposed)."""
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def tokens_per_call(self) -> float:
        """emitted / target_calls (0 before the first call)."""
        return self.emitted / self.target_calls if self.target_calls else 0.0

    @property
    def decode_seconds(self) -> float:
        """Time from encoder output to last token (drafter + verification + other)."""
        return self.drafter_seconds + self.verify_seconds + self.other_seconds

    def redecode_counts(self) -> Dict[str, float]:
        """What a stream's re-decodes came to, for a report: re-decodes, tokens per target call,
        the previous hypothesis's tokens offered and accepted, rows in the loop and in
        ``generate()``."""
        return {
            "redecodes": self.redecodes,
            "tokens_per_target_call": self.tokens_per_call,
            "offered": self.offered,
            "offered_accepted": self.offered_accepted,
            "rows_in_loop": self.rows_in_loop,
            "rows_in_generate": self.rows_in_generate,
        }

    def record_round(self, proposed: int, accepted: int) -> None:
        grow = proposed - len(self.proposed_by_position)
        if grow > 0:
            self.proposed_by_position.extend([0] * grow)
            self.accepted_by_position.extend([0] * grow)
        for j in range(proposed):
            self.proposed_by_position[j] += 1
        for j in range(accepted):
            self.accepted_by_position[j] += 1
        self.proposed += proposed
        self.accepted += accepted

    def record_offered_end(self, end: str) -> None:
        """Count one offered round's end (one of ``OFFERED_ENDS``)."""
        self.offered_ends[end] = self.offered_ends.get(end, 0) + 1

    def record_confidences(self, log_probs: Sequence[float], accepted: int, rejected: bool) -> None:
        """Count the judged positions of one verified block by confidence bin."""
        bins = DraftLengths.bins(log_probs[: accepted + int(rejected)])
        while len(self.calibration) < len(log_probs):
            self.calibration.append([[0, 0] for _ in range(CONFIDENCE_BINS)])
        for position, index in enumerate(bins):
            cell = self.calibration[position][index]
            cell[0] += 1
            cell[1] += int(position < accepted)

    def reset(self) -> None:
        for name, value in SpecStats().__dict__.items():
            setattr(self, name, value)
