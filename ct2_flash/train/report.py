"""A short training report next to a trained drafter: data, steps, time, validation curves."""

from __future__ import annotations

import collections
import json
import os


def write_report(data_dir: str, run_dir: str, out_dir: str) -> str:
    """Write ``training_report.md`` and ``validation_curves.png`` into ``out_dir``."""
    with open(os.path.join(run_dir, "train_state.json"), encoding="utf-8") as stream:
        meta = json.load(stream)
    with open(os.path.join(data_dir, "teacher.jsonl"), encoding="utf-8") as stream:
        teacher = [json.loads(line) for line in stream]
    with open(os.path.join(data_dir, "manifest.jsonl"), encoding="utf-8") as stream:
        seconds = {e["id"]: e["seconds"] for e in map(json.loads, stream)}
    hours = collections.Counter()
    voices = collections.defaultdict(set)
    for record in teacher:
        hours[record["split"]] += seconds[record["id"]] / 3600
        voices[record["split"]].add(record["voice"])
    os.makedirs(out_dir, exist_ok=True)
    _plot_curves(meta, os.path.join(out_dir, "validation_curves.png"))
    path = os.path.join(out_dir, "training_report.md")
    with open(path, "w", encoding="utf-8") as stream:
        stream.write("\n".join(_report_lines(meta, hours, voices)) + "\n")
    return path


def _plot_curves(meta: dict, path: str) -> None:
    """The training loss and the validations (held-out voices, and real speech where the run
    validated on some)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    validations = meta["validations"]
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 3.5))
    left.plot(range(1, len(meta["losses"]) + 1), meta["losses"], linewidth=0.6)
    left.set(xlabel="step", ylabel="weighted cross-entropy", title="training loss")
    steps = [v["step"] for v in validations]
    right.plot(
        steps, [v["mean_accepted_length"] for v in validations], marker="o", label="accepted length, held-out voices"
    )
    right.plot(steps, [v["tokens_per_call"] for v in validations], marker="s", label="tokens per call, held-out voices")
    real = [v for v in validations if "real" in v]
    if real:
        real_steps = [v["step"] for v in real]
        right.plot(
            real_steps,
            [v["real"]["mean_accepted_length"] for v in real],
            marker="o",
            linestyle="--",
            label="accepted length, real speech",
        )
        right.plot(
            real_steps,
            [v["real"]["tokens_per_call"] for v in real],
            marker="s",
            linestyle="--",
            label="tokens per call, real speech",
        )
    right.set(xlabel="step", title="validation, real cached loop")
    right.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def _report_lines(meta: dict, hours: dict, voices: dict) -> list:
    """The report's lines: the data, the steps, the best validation and how the run began."""
    validations = meta["validations"]
    # The checkpoint the run kept: chosen by real speech when it validated on some.
    by_real = meta.get("best_by") == "real"
    ranked = [v for v in validations if "real" in v] if by_real else validations
    best = max(ranked, key=lambda v: (v["real"] if by_real else v)["mean_accepted_length"]) if ranked else {}
    return [
        "# Drafter training report",
        "",
        f"- data: {hours['train']:.2f} h train ({sorted(voices['train'])}), "
        f"{hours['validation']:.2f} h validation ({sorted(voices['validation'])})",
        f"- steps: {meta['step']} of {meta['fit_config']['steps']}, batch {meta['fit_config']['batch_size']}, "
        f"{meta['fit_config']['blocks_per_utterance']} blocks per utterance, wall time {meta['seconds'] / 60:.1f} min",
        f"- best validation (step {best.get('step')}, chosen by {'real speech' if by_real else 'held-out voices'}), "
        "held-out voices: " + ", ".join(f"{k} {v:.3f}" for k, v in best.items() if k not in ("step", "real")),
        *(
            [
                (
                    "- same step, real speech (first windows of "
                    + str(best["real"]["windows"])
                    + " recordings): "
                    + ", ".join(f"{k} {v:.3f}" for k, v in best["real"].items() if k != "windows")
                )
            ]
            if "real" in best
            else []
        ),
        *_started_from(meta.get("init_from")),
        *_causal_from(meta.get("causal_blocks_from_step")),
        *(
            [
                f"- teacher files skipped as damaged: {len(meta['skipped_files'])} ({', '.join(meta['skipped_files'][:5])}"
                f"{', ...' if len(meta['skipped_files']) > 5 else ''})"
            ]
            if meta.get("skipped_files")
            else []
        ),
        "",
        "![validation curves](validation_curves.png)",
    ]


def _causal_from(step) -> list:
    """A report line saying from which step the run trained causal blocks (``fit`` records it)."""
    if step is None:
        return []
    if step == 0:
        return ["- causal blocks (a row reads the rows before it) from the start"]
    return [f"- causal blocks from step {step} (before it, every row read the whole block)"]


def _started_from(init_from) -> list:
    """A report line for a run that started from another run's checkpoint (``fit --init``)."""
    if not init_from:
        return []
    run = os.path.dirname(os.path.normpath(init_from))
    name = f"run {os.path.basename(run)}'s best checkpoint"
    state = os.path.join(run, "train_state.json")
    if not os.path.isfile(state):
        return [f"- started from {name}"]
    with open(state, encoding="utf-8") as stream:
        earlier = json.load(stream)
    return [
        f"- started from {name}: {earlier['step']} steps ({earlier['seconds'] / 60:.1f} min, "
        f"{earlier['train_utterances']} training utterances), best validation mean accepted length "
        f"{earlier['best']:.3f}"
    ]
