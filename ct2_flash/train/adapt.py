"""``ct2-flash adapt``: fine-tune a drafter on a user's own recordings, no transcripts needed.

The drafter's labels are what the frozen target does on the audio (its greedy tokens, its
decoder states, its distribution), so any recordings of the speech a user transcribes will
do. The steps, each resumable, all under the work directory ``<out>.adapt/`` next to the
drafter being written:

1. **audio** (``user_audio``): the files, split by file into training and held-out
   recordings, cut into the windows the target decodes (``audio/``, ``manifest.jsonl``).
2. **teacher** (``extract``): the target's greedy tokens, states and distribution for every
   window, at the compute type the drafter is adapted for (``teacher/``).
3. **fit**: fine-tune from the starting drafter (the shipped one by default) on the training
   windows, validating in the real cached loop on the held-out windows; the best checkpoint
   (never worse there than the start) and the latest state are kept (``run/``).
4. **held out**: the starting and the adapted drafter decode the held-out recordings as the
   defaults run them (``FlashWhisperModel(..., drafter=...)``, ``transcribe(beam_size=1)``).
5. **export**: the best checkpoint through ``converters`` into ``<out>`` (ONNX graphs checked
   against PyTorch), with ``adapted.json`` (the target and compute type it was adapted for:
   loading it next to another is refused) and ``adapt_report.json`` + ``adapt_report.png``.

The loop verifies every draft, so no drafter, however adapted, changes the target's output.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import asdict, dataclass, replace
from typing import Dict, List, Optional, Sequence

from ct2_flash.benchmark.machine import machine
from ct2_flash.train import user_audio

logger = logging.getLogger("ct2_flash")

# Fine-tuning updates per minute of training audio. On 15.8 minutes of one domain, 600
# updates (38 per minute) helped and 2,400 overfit; the held-out validation picks the best
# checkpoint along the way, so the schedule may be a little long.
STEPS_PER_MINUTE = 40
MIN_STEPS, MAX_STEPS = 100, 1500
# Held-out windows each validation decodes (up to a second and a half each on 2 cores for a
# 30 s window, about 10 validations); the first ones in file order when there are more.
MAX_VALIDATION_WINDOWS = 128
# Training state saved every this many updates: a killed run loses at most these (~10 s).
SAVE_EVERY = 25
PLAN_FILE = "plan.json"
REPORT_FILE = "adapt_report.json"
PLOT_FILE = "adapt_report.png"


class AdaptError(RuntimeError):
    """Adaptation cannot start or go on (said before any work where it can be known)."""


@dataclass(frozen=True)
class AdaptOptions:
    """What ``ct2-flash adapt`` runs with (checked once).

    Attributes:
        model: the target (a name the embedded models resolve, or a CTranslate2 directory).
        compute_type: the target's compute type; the drafter is refused at any other.
        start: the drafter to start from (None: the one shipped for ``model``).
        minutes: wall time one invocation may take; training stops early to stay inside it.
        holdout: fraction of the files held out for the measurement.
        steps: fine-tuning updates (None: ``STEPS_PER_MINUTE`` per minute of training audio,
            between ``MIN_STEPS`` and ``MAX_STEPS``).
        learning_rate: peak learning rate of the fine-tune.
        trained: "all" weights or the "last-layer" only (``fit.TRAINED``).
        audio_window: blocks read the runtime's window of the audio (False: all of it).
        threads: CPU threads for everything.
        bf16: training's forward pass under bfloat16 autocast; None (the default): where the
            CPU has bf16 instructions (``avx512_bf16``), decided when a run starts.
        speed_copies: each training window is also labelled at this many other speeds
            (``user_audio.speed_copies``; the teacher pass grows with them).
    """

    model: str = "tiny.en"
    compute_type: str = "float32"
    start: Optional[str] = None
    minutes: float = 60.0
    holdout: float = 0.2
    steps: Optional[int] = None
    learning_rate: float = 1e-4
    trained: str = "all"
    audio_window: bool = True
    threads: int = 2
    bf16: Optional[bool] = None
    speed_copies: int = 0

    def __post_init__(self) -> None:
        from ct2_flash.train.fit import TRAINED

        if not self.minutes > 0:
            raise ValueError(f"--minutes must be positive, not {self.minutes}")
        if not 0.0 < self.holdout < 1.0:
            raise ValueError(f"--holdout must be between 0 and 1 (a fraction of the files), not {self.holdout}")
        if self.steps is not None and self.steps < 10:
            raise ValueError(f"--steps must be at least 10, not {self.steps}")
        if not self.learning_rate > 0 or self.threads < 1:
            raise ValueError("the learning rate must be positive and threads >= 1")
        if not 0 <= self.speed_copies <= 4:
            raise ValueError(f"--speed-copies must be between 0 and 4, not {self.speed_copies}")
        if self.trained not in TRAINED:
            raise ValueError(f"--train must be one of {', '.join(TRAINED)}, not {self.trained!r}")


def work_dir_for(out: str) -> str:
    """Where the resumable steps keep their data: beside ``out``."""
    return os.path.abspath(out).rstrip(os.sep) + ".adapt"


def adapt(
    paths: Sequence[str],
    out: str,
    options: AdaptOptions = AdaptOptions(),
    resume: bool = False,
    force: bool = False,
    progress: bool = True,
) -> dict:
    """Adapt a drafter to the recordings under ``paths`` and write it to ``out``; returns the report.

    Raises:
        FileExistsError: ``out`` exists (without ``force``), or a previous adaptation's work
            is there (without ``resume`` or ``force``).
        FileNotFoundError: a path does not exist.
        AdaptError: no usable audio on one side of the split, PyTorch missing, a resumed run
            with other inputs.
        OSError: the disk filled up (what was written is kept; ``resume`` goes on from it).
    """
    started = time.time()
    deadline = started + 60 * options.minutes
    work = work_dir_for(out)
    _check_destination(out, work, resume, force)
    _require_training_extras()
    from ct2_flash.engine.models import resolve_model

    model_path = resolve_model(options.model)
    if options.bf16 is None:  # decided once and kept in the plan, so a resumed run trains the same way
        options = replace(options, bf16=cpu_has_bf16())
    plan = _plan(paths, work, options, resume)
    options = AdaptOptions(**plan["options"])  # a resumed run goes on with the options it started with

    # 1. audio
    sources, data = _audio_step(plan, work, options, progress)

    # 2. teacher
    from ct2_flash.train.extract import extract
    from ct2_flash.train.step_lock import step_lock

    with step_lock(work, "extract"):
        _timed(
            plan,
            work,
            "teacher",
            lambda: extract(
                work,
                model_name=model_path,
                compute_type=options.compute_type,
                threads=options.threads,
                progress=progress,
            ),
        )

    # 3. fit
    start = options.start or _shipped(options.model)
    run = os.path.join(work, "run")
    meta = _fit_step(plan, work, options, model_path, data, start, run, deadline, progress)

    # 4. export (into the work directory: <out> appears only when everything is there)
    export = os.path.join(work, "export")
    _timed(
        plan, work, "export", lambda: _export(run, export, model_path, meta, options, start, data["train"]["minutes"])
    )
    # 5. held out, as the defaults run the exported drafter
    held_files = [s.path for s in sources if s.split == "validation" and not s.skipped]
    decodes = _timed(
        plan,
        work,
        "held_out",
        lambda: held_out_decodes(held_files, {"start": start, "adapted": export}, model_path, options),
    )
    report = _report(plan, options, data, meta, decodes, start)
    _write_report(export, report, meta)
    if force:
        shutil.rmtree(out, ignore_errors=True)
    os.replace(export, out)
    return report


def _audio_step(plan: dict, work: str, options: AdaptOptions, progress: bool):
    """(the prepared sources, their summary): the recordings decoded, split and checked;
    AdaptError where one side of the split has no usable audio."""
    sources = _timed(
        plan, work, "audio", lambda: user_audio.prepare(work, plan["files"], progress, options.speed_copies)
    )
    data = user_audio.summarize(sources + [user_audio.Source(**s) for s in plan["empty_folders"]])
    for split, side in (("train", "training"), ("validation", "held-out")):
        if not user_audio.usable(sources, split):
            raise AdaptError(
                f"no usable {side} audio is left ({len(data['skipped'])} skipped: see the log); "
                f"add recordings with speech"
            )
    logger.info(
        "ct2-flash adapt: %.1f min of training audio in %d files, %.1f min held out in %d files",
        data["train"]["minutes"],
        data["train"]["files"],
        data["validation"]["minutes"],
        data["validation"]["files"],
    )
    return sources, data


def _fit_step(
    plan: dict,
    work: str,
    options: AdaptOptions,
    model_path: str,
    data: dict,
    start: str,
    run: str,
    deadline: float,
    progress: bool,
) -> dict:
    """The training run from ``start`` in ``run``, its steps fixed in the plan at the first
    try, stopping in time for the held-out decodes and the export; returns its record."""
    from ct2_flash.train.fit import FitConfig, fit, teacher_ids
    from ct2_flash.train.step_lock import step_lock

    steps = plan.setdefault("steps", options.steps or _default_steps(data["train"]["minutes"]))
    _save_plan(work, plan)
    held_out = len(teacher_ids(work, "validation"))
    if not held_out or not teacher_ids(work, "train"):
        raise AdaptError("the target produced no tokens on the training or the held-out recordings (silence or noise?)")
    config = FitConfig(
        steps=steps,
        batch_size=8,
        learning_rate=options.learning_rate,
        warmup_steps=max(1, min(50, steps // 10)),
        validate_every=max(10, steps // 8),
        save_every=SAVE_EVERY,
        validation_windows=min(held_out, MAX_VALIDATION_WINDOWS),
        trained=options.trained,
        bf16=options.bf16,
        audio_window=None if not options.audio_window else FitConfig().audio_window,
    )
    # Room at the end for the held-out decodes and the export: a tenth of the budget, 3 min at least.
    reserve = max(180.0, 6.0 * options.minutes)
    with step_lock(work, "fit"):
        return _timed(
            plan,
            work,
            "training",
            lambda: fit(
                work,
                run,
                config,
                model_name=model_path,
                threads=options.threads,
                progress=progress,
                init_from=start,
                compute_type=options.compute_type,
                deadline=deadline - reserve,
            ),
        )


def cpu_has_bf16() -> bool:
    """Whether the CPU has bfloat16 instructions (there bf16 autocast trains faster,
    ``bench/studies/train_bf16.py`` measures it; elsewhere it is emulated)."""
    from ct2_flash.benchmark.runner import machine

    return "avx512_bf16" in machine()["isa_flags"]


def _check_destination(out: str, work: str, resume: bool, force: bool) -> None:
    if os.path.exists(out) and not force:
        raise FileExistsError(f"{out} exists; choose another --out or pass --force to replace it")
    if os.path.exists(work) and not (resume or force):
        raise FileExistsError(
            f"{work} holds a previous adaptation's work: --resume goes on with it, --force starts over"
        )
    if force and not resume:
        shutil.rmtree(work, ignore_errors=True)


def _require_training_extras() -> None:
    try:
        import matplotlib  # noqa: F401
        import onnx  # noqa: F401
        import safetensors  # noqa: F401
        import torch  # noqa: F401
    except ImportError as error:
        raise AdaptError(
            f"ct2-flash adapt trains and exports a drafter, which needs PyTorch, safetensors, onnx and "
            f"matplotlib ({error}): pip install 'ct2-flash[train]'"
        ) from None


def _shipped(model: str) -> str:
    from ct2_flash.drafting.files import SHIPPED_DRAFTERS

    path = os.path.join(SHIPPED_DRAFTERS, os.path.basename(os.path.normpath(model)))
    if not os.path.isfile(os.path.join(path, "drafter.json")):
        raise AdaptError(f"no drafter is shipped for {model!r} to start from: pass --from DRAFTER")
    return path


def _default_steps(train_minutes: float) -> int:
    return int(min(MAX_STEPS, max(MIN_STEPS, round(STEPS_PER_MINUTE * train_minutes))))


def _plan(paths: Sequence[str], work: str, options: AdaptOptions, resume: bool) -> dict:
    """The files, their split and the options: decided once, read back on resume."""
    path = os.path.join(work, PLAN_FILE)
    if resume and os.path.isfile(path):
        with open(path, encoding="utf-8") as stream:
            plan = json.load(stream)
        files, _ = user_audio.find_audio(paths) if paths else (list(plan["files"]), [])
        if sorted(files) != sorted(plan["files"]):
            raise AdaptError(
                f"{work} was started on other audio ({len(plan['files'])} files, now {len(files)}): "
                f"pass the same files with --resume, or --force to start over"
            )
        changed = {k: v for k, v in asdict(options).items() if plan["options"].get(k) != v and k != "minutes"}
        if changed:
            logger.warning("ct2-flash adapt: resuming with the options the run started with; ignored: %s", changed)
        plan["options"]["minutes"] = options.minutes  # the budget is each invocation's own
        return plan
    files, empty = user_audio.find_audio(paths)
    if not files:
        raise AdaptError(f"no audio files under {', '.join(paths)}")
    plan = {
        "files": user_audio.split_by_file(files, options.holdout),
        "options": asdict(options),
        "empty_folders": [asdict(s) for s in empty],
        "seconds": {},
    }
    os.makedirs(work, exist_ok=True)
    _save_plan(work, plan)
    return plan


def _save_plan(work: str, plan: dict) -> None:
    path = os.path.join(work, PLAN_FILE)
    with open(path + ".tmp", "w", encoding="utf-8") as stream:
        json.dump(plan, stream, indent=1)
    os.replace(path + ".tmp", path)


def _timed(plan: dict, work: str, stage: str, step):
    """Run one stage and add its wall time to the plan (summed over resumes)."""
    began = time.time()
    result = step()
    plan["seconds"][stage] = round(plan["seconds"].get(stage, 0.0) + time.time() - began, 1)
    _save_plan(work, plan)
    return result


def held_out_decodes(
    files: Sequence[str], drafters: Dict[str, str], model_path: str, options: AdaptOptions
) -> Dict[str, dict]:
    """Each drafter decodes the held-out recordings as the defaults run them (VAD on for
    recordings over 30 s): calls each way and tokens per target call from ``spec_stats``, and
    whether the tokens are the same for every drafter on the recordings every drafter decoded
    greedily (the loop makes them so); a recording where one fell back to sampling
    (faster-whisper's temperature fallback) is counted apart, as each draws its own sample."""
    from ct2_flash.adapter.whisper_model import FlashWhisperModel

    results, texts = {}, {}
    for name, drafter in drafters.items():
        model = FlashWhisperModel(
            model_path, compute_type=options.compute_type, cpu_threads=options.threads, drafter=drafter, redecodes=False
        )
        texts[name] = []
        for path in files:
            long = _seconds(path) > user_audio.WINDOW_SECONDS
            segments, _ = model.transcribe(path, beam_size=1, vad_filter=long)
            texts[name].append([(s.tokens, s.temperature) for s in segments])
        stats = model.spec_stats
        first = stats.proposed_by_position[0] if stats.proposed_by_position else 0
        results[name] = {
            "tokens_per_call": round(stats.tokens_per_call, 3),
            "loop_rows": stats.rows_in_loop,
            "generate_rows": stats.rows_in_generate + stats.unchanged_calls,
            "acceptance": round(stats.acceptance_rate, 4),
            "first_position_acceptance": round(stats.accepted_by_position[0] / first, 4) if first else None,
        }
        del model
    first = next(iter(texts.values()))
    greedy = [i for i in range(len(files)) if all(t == 0 for name in texts for _, t in texts[name][i])]
    identical = [i for i in greedy if all(texts[name][i] == first[i] for name in texts)]
    return {"files": len(files), "greedy_files": len(greedy), "identical": len(identical), **results}


def _seconds(path: str) -> float:
    import av

    with av.open(path) as container:
        return float(container.duration or 0) / 1e6


def _report(plan: dict, options: AdaptOptions, data: dict, meta: dict, decodes: dict, start: str) -> dict:
    validations = meta["validations"]
    initial = validations[0]
    best = max(validations, key=lambda v: v["mean_accepted_length"])
    keys = ("tokens_per_call", "first_position_acceptance", "mean_accepted_length", "acceptance_rate")
    return {
        "model": options.model,
        "compute_type": meta["compute_type"],
        "start": start,
        "options": asdict(options),
        "data": data,
        "training": {
            "steps": meta["step"],
            "planned_steps": meta["fit_config"]["steps"],
            "stopped_at": meta.get("stopped_at"),
            "best_step": best["step"],
            "updates_per_second": round(meta["step"] / max(1.0, meta["seconds"]), 2),
        },
        "held_out": {
            "every_round": {
                "start": {k: round(initial[k], 4) for k in keys},
                "adapted": {k: round(best[k], 4) for k in keys},
                "windows": meta["validation_utterances"],
            },
            "defaults": decodes,
        },
        "curve": [{"step": v["step"], **{k: round(v[k], 4) for k in keys}} for v in validations],
        # Over every stage's time, summed across resumed runs.
        "audio_minutes_per_minute": round(
            (data["train"]["minutes"] + data["validation"]["minutes"]) / (max(1.0, sum(plan["seconds"].values())) / 60),
            2,
        ),
        "seconds": dict(plan["seconds"]),
        "machine": machine(),
    }


def _export(run: str, out: str, model_path: str, meta: dict, options: AdaptOptions, start: str, minutes: float) -> None:
    from ct2_flash.converters import convert_drafter
    from ct2_flash.drafting.files import write_adapted

    convert_drafter(os.path.join(run, "best"), out, model_path, force=True)
    write_adapted(out, model_path, meta["compute_type"], {"start": start, "training_minutes": minutes})


def _write_report(out: str, report: dict, meta: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(os.path.join(out, REPORT_FILE), "w", encoding="utf-8") as stream:
        json.dump(report, stream, indent=1)
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 3.5))
    losses = meta["losses"]
    if losses:
        width = max(1, len(losses) // 50)
        smooth = [sum(losses[i : i + width]) / len(losses[i : i + width]) for i in range(0, len(losses), width)]
        left.plot([min(len(losses), i + width) for i in range(0, len(losses), width)], smooth)
    left.set(xlabel="update", ylabel="loss", title="training loss (training recordings)")
    steps = [point["step"] for point in report["curve"]]
    right.plot(
        steps, [point["tokens_per_call"] for point in report["curve"]], marker="o", label="tokens per target call"
    )
    right.plot(
        steps,
        [point["first_position_acceptance"] * 4 for point in report["curve"]],
        marker="s",
        label="first-position acceptance x4",
    )
    right.axvline(report["training"]["best_step"], color="grey", linestyle=":", label="kept")
    right.set(xlabel="update", title="held-out recordings, every round drafting")
    right.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(os.path.join(out, PLOT_FILE), dpi=110)
    plt.close(figure)


def summary_lines(report: dict) -> List[str]:
    """What ``ct2-flash adapt`` prints at the end."""
    every = report["held_out"]["every_round"]
    defaults = report["held_out"]["defaults"]
    data = report["data"]
    seconds = report["seconds"]
    lines = [
        f"audio: {data['train']['minutes']:.1f} min for training ({data['train']['files']} files), "
        f"{data['validation']['minutes']:.1f} min held out ({data['validation']['files']} files), "
        f"{len(data['skipped'])} skipped",
        f"held out, every round drafting ({every['windows']} windows): tokens per target call "
        f"{every['start']['tokens_per_call']:.2f} -> {every['adapted']['tokens_per_call']:.2f}, first-position "
        f"acceptance {every['start']['first_position_acceptance']:.1%} -> {every['adapted']['first_position_acceptance']:.1%}",
        f"held out, as the defaults run it: tokens per target call {defaults['start']['tokens_per_call']:.2f} -> "
        f"{defaults['adapted']['tokens_per_call']:.2f}; rows in the loop {defaults['start']['loop_rows']} -> "
        f"{defaults['adapted']['loop_rows']}, through generate() {defaults['start']['generate_rows']} -> "
        f"{defaults['adapted']['generate_rows']}; same tokens on {defaults['identical']}/{defaults['greedy_files']} files "
        f"decoded greedily ({defaults['files'] - defaults['greedy_files']} fell back to sampling)",
        "time: "
        + ", ".join(f"{stage} {value / 60:.1f} min" for stage, value in seconds.items())
        + f" ({report['audio_minutes_per_minute']:.2f} min of audio per minute)",
    ]
    if report["training"]["stopped_at"] is not None:
        lines.append(
            f"training stopped at update {report['training']['stopped_at']} of "
            f"{report['training']['planned_steps']} to stay within --minutes"
        )
    return lines
