"""The timed runs: plain faster-whisper against ``FlashWhisperModel`` on the same audio, greedy
or at fixed sampling temperatures (``temperatures``).

Both systems (and, with ``--stock``, faster-whisper on stock CTranslate2 in worker processes:
plain, ``stock``, and with the allocator an informed user sets, ``tuned_stock``) run on audio
decoded once, after a warm-up, interleaved per utterance in every order of the systems in turn
(slow drift of the machine, and the spinning workers a call leaves behind, hit all alike), for
several repeats; per utterance the median over repeats is used. The decode part is the time
inside ``generate()`` (encoder output to last token), the whole path is waveform to segments.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import ctranslate2
import numpy as np

from ct2_flash.benchmark.analysis import (
    bucket_labels,
    bucket_of,
    paired_bootstrap,
    word_error_rate,
    word_error_rate_interval,
)
from ct2_flash.benchmark.drafters import ORACLE, build_drafter
from ct2_flash.benchmark.machine import machine
from ct2_flash.benchmark.manifest import Utterance
from ct2_flash.benchmark.measure import Measurement, measure
from ct2_flash.benchmark.stock import STOCK_SYSTEMS, StockWorker, allocators_of, stock_systems
from ct2_flash.engine.models import resolve_model
from ct2_flash.loop.draft_lengths import CONFIDENCE_BINS
from ct2_flash.stock.allocator import loaded_allocator

SAMPLE_RATE = 16000


@dataclass(frozen=True)
class BenchConfig:
    """What to run (checked once).

    Attributes:
        model: embedded model name or CTranslate2 model directory.
        drafter: checkpoint directory; None for the model's default drafter; "builtin" for
            ``PromptLookupDrafter``; "oracle" for the test oracle (it replays the target's own
            greedy output and drafts every round, so it shows the loop's ceiling, not a real
            drafter).
        drafter_options: (name, value) pairs for the drafter's constructor (``drafters``): the
            oracle's ``error_rate``, a converted drafter's ``precision``, ``min_confidence`` or
            ``audio_window``, ``runtime="pytorch"`` for the PyTorch round, ...
        compute_types, threads: every combination is one setting.
        num_draft_tokens: K.
        repeats: timed passes over all utterances.
        without_timestamps: transcribe without timestamp tokens.
        word_timestamps: faster-whisper's word timestamps (its ``align()`` after each window).
        stock_python: the interpreter that times faster-whisper on stock ctranslate2 (as users
            install it today) in a worker process: a stock environment's
            (``stock.ensure_environment``) or this one's with ``stock_path``
            (``stock.local_baseline``); "" to skip.
        stock_path: put first on that worker's ``sys.path`` (the stock engine's directory), or "".
        batch_sizes: also compare ``BatchedInferencePipeline`` runs at these batch sizes
            (worth it on recordings longer than one 30 s window).
        decoder_threads: ``FlashWhisperModel(decoder_threads=...)``.
        guard_margin: ``FlashWhisperModel(guard_margin=...)``; None for the model's default.
        temperatures: one setting per temperature: ``transcribe(temperature=t)`` (one value, so
            no fallback) for both systems; 0 is greedy, above 0 samples ``best_of`` hypotheses
            per window. Sampled outputs are compared by WER, not token for token.
        best_of: ``transcribe(best_of=...)`` at temperatures above 0.
        adaptive: ``FlashWhisperModel(adaptive=...)``: False drafts every round of every call
            (what the loop and the drafter can do), True is the default model (the router
            sends calls where drafting does not pay to ``generate()``).
        draw_drafts: under sampling, draw drafts from the drafter's distribution (the default);
            False proposes its most likely tokens outright (see ``SpeculativeDecoder``).
        near_exact: ``FlashWhisperModel(near_exact=...)``: also run the loop at compute types
            where it is not exact (int8); without it such settings measure ``generate()``.
        stock_engine: ``FlashWhisperModel(stock_engine=...)`` (default True, as the model's):
            the encoder and the calls outside the loop on stock ctranslate2 in a worker process.
    """

    model: str = "tiny.en"
    drafter: Optional[str] = None
    drafter_options: Tuple[Tuple[str, Any], ...] = ()
    compute_types: Tuple[str, ...] = ("int8",)
    threads: Tuple[int, ...] = (2,)
    num_draft_tokens: int = 8
    repeats: int = 3
    without_timestamps: bool = False
    word_timestamps: bool = False
    stock_python: str = ""
    stock_path: str = ""
    batch_sizes: Tuple[int, ...] = ()
    decoder_threads: Union[int, None, str] = "auto"
    guard_margin: Optional[float] = None
    temperatures: Tuple[float, ...] = (0.0,)
    best_of: int = 1
    adaptive: bool = True
    draw_drafts: bool = True
    near_exact: bool = False
    stock_engine: bool = True

    def __post_init__(self) -> None:
        if not self.temperatures or not all(np.isfinite(t) and t >= 0 for t in self.temperatures):
            raise ValueError("temperatures must be finite numbers >= 0")
        if self.best_of < 1:
            raise ValueError("best_of must be >= 1")
        if any(size < 1 for size in self.batch_sizes):
            raise ValueError("batch sizes must be >= 1")
        if self.repeats < 1 or self.num_draft_tokens < 1:
            raise ValueError("repeats and num_draft_tokens must be >= 1")
        if not self.compute_types or not self.threads or min(self.threads) < 1:
            raise ValueError("need at least one compute type and thread counts >= 1")
        names = [name for name, _ in self.drafter_options]
        if len(set(names)) != len(names):
            raise ValueError(f"a drafter option is given twice: {names}")


def load_audio(utterances: Sequence[Utterance]) -> Dict[str, np.ndarray]:
    """Decode every file once (PyAV via faster-whisper); a clear error names a bad file."""
    from faster_whisper import decode_audio

    audio = {}
    for utterance in utterances:
        try:
            samples = decode_audio(utterance.path, sampling_rate=SAMPLE_RATE)
        except Exception as error:  # PyAV raises many types for unreadable input
            raise ValueError(f"cannot read audio {utterance.path!r}: {error}") from error
        if samples.size == 0:
            raise ValueError(f"{utterance.path!r} contains no audio")
        audio[utterance.path] = samples
    return audio


def stock_workers(config: BenchConfig, path: str, compute_type: str, threads: int) -> Dict[str, StockWorker]:
    """The stock systems (``stock.stock_systems``), none without ``stock_python``."""
    if not config.stock_python:
        return {}
    return stock_systems(config.stock_python, path, compute_type, threads, config.stock_path)


def _flash_model(config: BenchConfig, path: str, compute_type: str, threads: int):
    # Here, not at the top: the adapter loads faster-whisper and the engine, which reading a
    # manifest or a report does not need.
    from ct2_flash.adapter.whisper_model import FlashWhisperModel

    drafter = build_drafter(config.drafter, dict(config.drafter_options), config.model, path, compute_type, threads)
    return FlashWhisperModel(
        path,
        compute_type=compute_type,
        cpu_threads=threads,
        decoder_threads=config.decoder_threads,
        guard_margin=config.guard_margin,
        num_draft_tokens=config.num_draft_tokens,
        drafter=drafter,
        adaptive=config.adaptive and config.drafter != ORACLE,
        draw_drafts=config.draw_drafts,
        near_exact=config.near_exact,
        stock_engine=config.stock_engine,
        redecodes=False,
    )


def run_setting(
    config: BenchConfig,
    utterances: Sequence[Utterance],
    audio: Dict[str, np.ndarray],
    compute_type: str,
    threads: int,
    progress: bool = True,
    temperature: float = 0.0,
) -> dict:
    """Measure one (compute type, threads, temperature) setting; returns its report section."""
    from faster_whisper import WhisperModel

    path = resolve_model(config.model)
    baseline = WhisperModel(path, compute_type=compute_type, cpu_threads=threads)
    flash = _flash_model(config, path, compute_type, threads)
    stocks = stock_workers(config, path, compute_type, threads)
    options = dict(
        beam_size=1,
        without_timestamps=config.without_timestamps,
        word_timestamps=config.word_timestamps,
        temperature=temperature,
        best_of=config.best_of,
    )

    def run_flash(key, samples, seed):
        flash.reset_spec_stats()
        return measure(flash, samples, **options), dataclasses.replace(flash.spec_stats)

    systems = {"baseline": lambda key, samples, seed: measure(baseline, samples, **options), "flash": run_flash}
    for name, stock in stocks.items():
        systems[name] = lambda key, samples, seed, stock=stock: stock.measure(key, samples, seed, **options)
    try:
        first = utterances[0]
        for run_system in systems.values():  # warm-up: first calls allocate and load kernels
            run_system(first.path, audio[first.path], 0)
        if config.drafter == "oracle":  # the oracle decodes each window once, then replays it
            for utterance in utterances[1:]:
                measure(flash, audio[utterance.path], **options)
        runs = _interleave(
            systems,
            utterances,
            audio,
            config.repeats,
            f"{compute_type}, {threads} thread(s), T={temperature:g}",
            progress,
        )
        for run in runs:
            run["flash"], run["stats"] = [m for m, _ in run["flash"]], [stats for _, stats in run["flash"]]
    finally:
        for stock in stocks.values():
            stock.close()
        flash.model.engines.close()  # its stock worker, if it has one
    rows = [_utterance_row(u, audio[u.path], runs[i]) for i, u in enumerate(utterances)]
    return {
        "compute_type": compute_type,
        "threads": threads,
        "temperature": temperature,
        "drafter": type(flash.drafter).__name__,
        # decoder_threads="auto": the timed choice between the shared model and a one-thread copy
        "decoder_split": {**dataclasses.asdict(flash.decoder_split), "split": flash.decoder_split.split}
        if flash.decoder_split
        else None,
        "stock_ctranslate2": stocks["stock"].version if stocks else None,
        "stock_allocators": allocators_of(stocks),
        # ct2-flash's own process (the features, the loop): tcmalloc where ``ct2-flash bench`` ran
        # under it (``stock.allocator.preload_for_command``)
        "flash_allocator": loaded_allocator(os.getpid()),
        # The stock engine's worker (if on): generate() calls each engine served over the
        # whole setting (warm-up included), and the greedy costs per token it measured.
        "engines": _engines_report(flash.model.engines),
        "summary": summarise(rows),
        "utterances": rows,
    }


def _engines_report(engines) -> dict:
    """What the model's two engines did over a setting."""
    stock = engines.stock
    return {
        "stock_active": engines.stock_active,
        "generate_calls": dict(engines.generate_calls),
        "patched_cost": engines.engine_router.patched_cost,
        "stock_cost": dict(engines.engine_router.stock_cost),
        "stock_failures": engines.stock_failures,
        "keeps_freed_memory": stock.keeps_freed_memory if stock is not None else None,
        "allocator": stock.allocator if stock is not None else None,
        # Per request kind: requests, seconds from send to answer, seconds the worker spent on
        # them (the difference is the channel: pipes, copies, JSON).
        "channel": {
            op: {"requests": n, "round_trip_seconds": trip, "worker_seconds": work}
            for op, (n, trip, work) in stock.timings.items()
        }
        if stock is not None
        else {},
    }


def run_batched(
    config: BenchConfig,
    utterances: Sequence[Utterance],
    audio: Dict[str, np.ndarray],
    compute_type: str,
    threads: int,
    progress: bool = True,
) -> List[dict]:
    """faster-whisper's ``BatchedInferencePipeline`` around each system, per batch size.

    ct2-flash decodes the speculative rows of a batch one after another (the patched decoder
    keeps one sequence per state), faster-whisper decodes them together; this shows what that
    costs. With ``config.stock_python`` the pipeline around faster-whisper on stock ctranslate2
    (in its own process) is a third system, as in ``run_setting``.
    """
    from faster_whisper import BatchedInferencePipeline, WhisperModel

    path = resolve_model(config.model)
    baseline = BatchedInferencePipeline(WhisperModel(path, compute_type=compute_type, cpu_threads=threads))
    flash = BatchedInferencePipeline(_flash_model(config, path, compute_type, threads))
    stocks = stock_workers(config, path, compute_type, threads)
    sections = []
    try:
        for batch_size in config.batch_sizes:
            options = dict(beam_size=1, batch_size=batch_size, word_timestamps=config.word_timestamps)
            systems = {
                name: (
                    lambda key, samples, seed, pipeline=pipeline, options=options: measure(pipeline, samples, **options)
                )
                for name, pipeline in (("baseline", baseline), ("flash", flash))
            }
            for name, stock in stocks.items():
                systems[name] = lambda key, samples, seed, stock=stock, options=options: stock.measure(
                    key, samples, seed, batched=True, **options
                )
            first = utterances[0]
            for run_system in systems.values():  # warm-up: first calls allocate and load kernels
                run_system(first.path, audio[first.path], 0)
            flash.model.reset_spec_stats()
            runs = _interleave(systems, utterances, audio, config.repeats, f"batch {batch_size}", progress)
            sections.append(_batched_section(batch_size, utterances, audio, runs, flash.model.spec_stats))
    finally:
        for stock in stocks.values():
            stock.close()
        flash.model.model.engines.close()  # its stock worker, if it has one
    return sections


def _batched_section(
    batch_size: int, utterances: Sequence[Utterance], audio: Dict[str, np.ndarray], runs: List[Dict[str, list]], stats
) -> dict:
    """One batch size's report: per utterance the median times of each system, identity
    against faster-whisper on the same engine (and on stock), and the speed-ups over all."""
    names = [name for name in ("baseline", "flash", *STOCK_SYSTEMS) if name in runs[0]]
    rows = []
    for index, utterance in enumerate(utterances):
        got = runs[index]["flash"]
        rows.append(
            {
                "name": utterance.name,
                "seconds": audio[utterance.path].size / SAMPLE_RATE,
                "identical": all(map(_same, runs[index]["baseline"], got)),
                **{
                    f"{name}_identical": all(map(_same, runs[index][name], got))
                    for name in STOCK_SYSTEMS
                    if name in names
                },
                **{name: _medians(runs[index][name]) for name in names},
            }
        )
    audio_seconds = sum(r["seconds"] for r in rows)
    return {
        "batch_size": batch_size,
        "speedup": _speedups(rows),
        "token_identity": {"identical": sum(r["identical"] for r in rows), "of": len(rows)},
        **_versus_stock(rows),
        "audio_seconds_per_second": {name: audio_seconds / sum(r[name]["whole"] for r in rows) for name in names},
        # over every timed repeat: which way the rows went
        "speculative_rows": stats.rows_in_loop,
        "generate_rows": stats.rows_in_generate,
        "utterances": rows,
    }


def _interleave(
    systems: Dict[str, Callable],
    utterances: Sequence[Utterance],
    audio: Dict[str, np.ndarray],
    repeats: int,
    description: str,
    progress: bool,
) -> List[Dict[str, list]]:
    """Run every system on every utterance, ``repeats`` times, in every order of the systems in turn.

    Args:
        systems: name -> callable(key, samples, seed) returning that system's result.
    Returns:
        per utterance index (a manifest may list one file twice): name -> results in repeat order.
    """
    from tqdm import tqdm

    runs: List[Dict[str, list]] = [{name: [] for name in systems} for _ in utterances]
    # Every order of the systems in turn: slow drift of the machine hits all alike, and each
    # system follows each other one equally often (a CTranslate2 call leaves its OpenMP
    # workers spinning for a while, which slows whatever runs next; with rotations of three
    # systems one of them followed another two times in three).
    orders = list(itertools.permutations(systems))
    bar = tqdm(total=repeats * len(utterances), desc=description, disable=not progress)
    for repeat in range(repeats):
        for index, utterance in enumerate(utterances):
            for name in orders[(repeat * len(utterances) + index) % len(orders)]:
                # Temperature fallback samples inside CTranslate2; the same seed for every
                # system makes their fallbacks comparable.
                ctranslate2.set_random_seed(repeat)
                runs[index][name].append(systems[name](utterance.path, audio[utterance.path], repeat))
            bar.update(1)
    bar.close()
    return runs


def _same(one: Measurement, other: Measurement) -> bool:
    """The same output: tokens, and word timings where words were asked for."""
    return one.tokens == other.tokens and one.words == other.words


def _medians(runs: Sequence[Measurement]) -> Dict[str, float]:
    """A system's median decode, whole-path and encoder seconds over its repeats."""
    return {
        part: statistics.median(getattr(run, f"{part}_seconds") for run in runs)
        for part in ("decode", "whole", "encode")
    }


def _utterance_row(utterance: Utterance, samples: np.ndarray, runs: Dict[str, list]) -> dict:
    base, flash, stats = runs["baseline"], runs["flash"], runs["stats"]
    seconds = samples.size / SAMPLE_RATE
    # Greedy decoding is deterministic: every repeat drafts and accepts the same, so counts
    # come from the first repeat and times are averaged over all.
    counts = stats[0]
    drafter_seconds = statistics.fmean(item.drafter_seconds for item in stats)
    verify_seconds = statistics.fmean(item.verify_seconds for item in stats)
    loop_seconds = statistics.fmean(item.other_seconds for item in stats)
    generate_seconds = statistics.fmean(item.generate_seconds for item in stats)
    return {
        "name": utterance.name,
        "path": utterance.path,
        "seconds": seconds,
        "bucket": bucket_of(seconds),
        "reference": utterance.reference,
        "baseline_text": base[0].text,
        "flash_text": flash[0].text,
        "tokens": sum(len(t) for t in base[0].tokens),
        "words": len(base[0].words),  # timed words (word_timestamps), compared with the tokens
        "identical": all(map(_same, base, flash)),
        "baseline": _medians(base),
        "flash": {
            **_medians(flash),
            "drafter": drafter_seconds,
            "verify": verify_seconds,
            "loop": loop_seconds,
            "generate": generate_seconds,
        },
        **{
            key: value
            for name in STOCK_SYSTEMS
            if runs.get(name)
            for key, value in ((name, _medians(runs[name])), (f"{name}_identical", all(map(_same, runs[name], flash))))
        },
        "target_calls": counts.target_calls,
        "emitted": counts.emitted,
        "draft_rounds": counts.draft_rounds,
        # The draft pause's decisions depend on timing: these two are from the first repeat.
        "drafting_stopped": counts.windows_drafting_stopped,
        "drafting_resumed": counts.drafting_resumed,
        "rows_rechecked": counts.rows_rechecked,
        # Which way the calls went (CallRouter): rows of the speculative loop and rows
        # sent to CTranslate2's generate(); timing-dependent, from the first repeat.
        "speculative_rows": counts.rows_in_loop,
        "generate_rows": counts.rows_in_generate,
        # Calls generate() served for a reason of their own (int8 without near_exact, beam search).
        "other_calls": counts.unchanged_calls,
        "calibration": [[list(cell) for cell in position] for position in counts.calibration],
        "proposed_by_position": list(counts.proposed_by_position),
        "accepted_by_position": list(counts.accepted_by_position),
    }


def _ratio(numerator: float, denominator: float) -> Optional[float]:
    return numerator / denominator if denominator else None


def _speedups(rows: Sequence[dict], reference: str = "baseline") -> dict:
    return {
        part: paired_bootstrap([r[reference][part] for r in rows], [r["flash"][part] for r in rows])
        for part in ("decode", "whole")
    }


def _versus_stock(rows: Sequence[dict]) -> dict:
    """Per stock system: ct2-flash's speed-ups against it and its token identity (None
    without ``--stock``): ``speedup_vs_stock``, ``stock_token_identity``,
    ``speedup_vs_tuned_stock``, ``tuned_stock_token_identity``."""
    report = {}
    for name in STOCK_SYSTEMS:
        present = bool(rows) and all(name in r for r in rows)
        report[f"speedup_vs_{name}"] = _speedups(rows, name) if present else None
        report[f"{name}_token_identity"] = (
            {"identical": sum(r[f"{name}_identical"] for r in rows), "of": len(rows)} if present else None
        )
    return report


def summarise(rows: Sequence[dict]) -> dict:
    """Totals over utterances: speedups with 95% intervals, throughput, identity, WER,
    acceptance (overall, first position, by position), per-bucket speedups, time split."""
    audio_seconds = sum(r["seconds"] for r in rows)
    tokens = sum(r["tokens"] for r in rows)
    proposed = np.zeros(max((len(r["proposed_by_position"]) for r in rows), default=0), dtype=np.int64)
    accepted = np.zeros_like(proposed)
    for r in rows:
        # An utterance without any draft round has empty lists.
        proposed[: len(r["proposed_by_position"])] += np.asarray(r["proposed_by_position"], dtype=np.int64)
        accepted[: len(r["accepted_by_position"])] += np.asarray(r["accepted_by_position"], dtype=np.int64)
    stocks = tuple(name for name in STOCK_SYSTEMS if rows and all(name in r for r in rows))
    systems = {system: _system_totals(rows, system, audio_seconds, tokens) for system in ("baseline", "flash", *stocks)}
    buckets = {}
    for label in bucket_labels():
        members = [r for r in rows if r["bucket"] == label]
        if members:
            buckets[label] = {
                "utterances": len(members),
                "audio_seconds": sum(r["seconds"] for r in members),
                **_speedups(members),
            }
    return {
        "utterances": len(rows),
        "audio_seconds": audio_seconds,
        "generated_tokens": tokens,
        "speedup": _speedups(rows),
        "token_identity": {"identical": sum(r["identical"] for r in rows), "of": len(rows)},
        **_versus_stock(rows),
        "acceptance_rate": _ratio(int(accepted.sum()), int(proposed.sum())),
        "tokens_per_target_call": _ratio(sum(r["emitted"] for r in rows), sum(r["target_calls"] for r in rows)),
        "acceptance_by_position": [_ratio(int(a), int(p)) for a, p in zip(accepted, proposed)],
        "first_position_acceptance": _ratio(int(accepted[0]), int(proposed[0])) if proposed.size else None,
        "draft_rounds": sum(r["draft_rounds"] for r in rows),
        "drafting_stopped": sum(r["drafting_stopped"] for r in rows),
        "drafting_resumed": sum(r["drafting_resumed"] for r in rows),
        "rows_rechecked": sum(r["rows_rechecked"] for r in rows),
        "speculative_rows": sum(r.get("speculative_rows", 0) for r in rows),
        "generate_rows": sum(r.get("generate_rows", 0) for r in rows),
        "other_calls": sum(r.get("other_calls", 0) for r in rows),
        "draft_round_ms": _ratio(1e3 * sum(r["flash"]["drafter"] for r in rows), sum(r["draft_rounds"] for r in rows)),
        "calibration": calibration_cells(rows),
        "break_even": break_even(rows, systems, tokens),
        "systems": systems,
        "buckets": buckets,
    }


def _system_totals(rows: Sequence[dict], system: str, audio_seconds: float, tokens: int) -> dict:
    """One system's totals over the utterances: throughput, seconds, the time split (the
    loop's parts for ct2-flash), WER for the systems that have the references' texts."""
    whole = sum(r[system]["whole"] for r in rows)
    decode = sum(r[system]["decode"] for r in rows)
    encode = sum(r[system]["encode"] for r in rows)
    # Each second is booked once (the loop's parts inside generate(), generate() inside the
    # whole path), so the parts add up to the whole without a clamp (tests/test_bench.py).
    split = {"encoder": encode, "decode": decode, "rest of whole path": whole - encode - decode}
    if system == "flash":
        drafter, verify, loop, generate = (
            sum(r["flash"][part] for r in rows) for part in ("drafter", "verify", "loop", "generate")
        )
        # Calls the router sent to CTranslate2's generate() are decode time too, but not the
        # loop's: each part gets its own bar.
        split = {
            "encoder": encode,
            "drafter": drafter,
            "verification": verify,
            "loop bookkeeping (python, rules)": loop,
            "generate() calls": generate,
            "other decode (faster-whisper, wrapper)": decode - drafter - verify - loop - generate,
            "rest of whole path": whole - encode - decode,
        }
    # Stock systems' rows hold no texts of their own (their identity with ct2-flash is counted).
    scored = system not in STOCK_SYSTEMS
    references = [r["reference"] for r in rows]
    texts = [r[f"{system}_text"] for r in rows] if scored else []
    return {
        "audio_seconds_per_second": _ratio(audio_seconds, whole),
        "generated_tokens_per_second": _ratio(tokens, decode),
        "whole_seconds": whole,
        "decode_seconds": decode,
        "time_split_seconds": split,
        "wer": word_error_rate(references, texts) if scored else None,
        "wer_interval": word_error_rate_interval(references, texts) if scored else None,
    }


def break_even(rows: Sequence[dict], systems: Dict[str, dict], tokens: int) -> Optional[dict]:
    """What one of the loop's target calls cost in this run (its drafter, its verification,
    prefill included, and its bookkeeping, over every target call), and the tokens a call
    must emit to cost no more than each system's decode takes per output token: where the
    loop pays. None where no call ran in the loop."""
    calls = sum(r["target_calls"] for r in rows)
    if not calls or not tokens:
        return None
    call_ms = 1e3 * sum(r["flash"]["drafter"] + r["flash"]["verify"] + r["flash"]["loop"] for r in rows) / calls
    per_token = {
        system: 1e3 * entry["decode_seconds"] / tokens for system, entry in systems.items() if system != "flash"
    }
    return {
        "loop_call_ms": call_ms,
        "decode_ms_per_token": per_token,
        "tokens_per_call": {system: call_ms / ms for system, ms in per_token.items() if ms > 0},
    }


def calibration_cells(rows: Sequence[dict]) -> List[List[dict]]:
    """Per draft position and drafter-confidence bin: judged positions and the observed
    acceptance (a position is judged when every draft before it was accepted), summed over
    ``rows`` (each with ``SpecStats.calibration``: [position][bin] -> [judged, accepted])."""
    positions = max((len(r.get("calibration", [])) for r in rows), default=0)
    counts = np.zeros((positions, CONFIDENCE_BINS, 2), dtype=np.int64)
    for r in rows:
        for position, cells in enumerate(r.get("calibration", [])):
            counts[position] += np.asarray(cells, dtype=np.int64)
    return [
        [
            {
                "confidence": (b + 0.5) / CONFIDENCE_BINS,
                "judged": int(counts[p, b, 0]),
                "observed": _ratio(int(counts[p, b, 1]), int(counts[p, b, 0])),
            }
            for b in range(CONFIDENCE_BINS)
        ]
        for p in range(positions)
    ]


def run(config: BenchConfig, utterances: Sequence[Utterance], progress: bool = True) -> dict:
    """Every setting of ``config`` on ``utterances``; returns the JSON document."""
    if not utterances:
        raise ValueError("nothing to benchmark")
    started = time.time()
    audio = load_audio(utterances)
    settings = []
    for compute_type in config.compute_types:
        for threads in config.threads:
            for temperature in config.temperatures:
                setting = run_setting(config, utterances, audio, compute_type, threads, progress, temperature)
                if config.batch_sizes and temperature == 0:
                    setting["batched"] = run_batched(config, utterances, audio, compute_type, threads, progress)
                settings.append(setting)
    return {
        "what": "faster-whisper vs ct2-flash (FlashWhisperModel), same engine, same decoded audio",
        "config": dataclasses.asdict(config),
        "machine": machine(),
        "wall_seconds": time.time() - started,
        "settings": settings,
    }
