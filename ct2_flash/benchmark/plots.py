"""PNG plots of a benchmark document (matplotlib, no display needed)."""

from __future__ import annotations

import os
from typing import List

SYSTEM_NAMES = {
    "baseline": "faster-whisper, same engine",
    "flash": "ct2-flash",
    "stock": "faster-whisper, stock ct2",
    "tuned_stock": "faster-whisper, stock ct2 + tuned allocator",
}


def write_plots(document: dict, out_dir: str) -> List[str]:
    """Speedup by duration bucket, acceptance by draft position, where the time goes, and the
    drafter's calibration where the runs have it.

    One figure each, every setting of the document in it; returns the written paths.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    settings = document["settings"]
    labels = [
        f"{s['compute_type']}, {s['threads']} thr" + (f", T={s['temperature']:g}" if s.get("temperature") else "")
        for s in settings
    ]
    paths = [
        _save(_speedups(plt, settings, labels), out_dir, "speedup_by_duration.png"),
        _save(_acceptance(plt, settings, labels), out_dir, "acceptance_by_position.png"),
        _save(_time_split(plt, settings, labels), out_dir, "time_split.png"),
    ]
    calibrated = [(label, setting["summary"].get("calibration") or []) for label, setting in zip(labels, settings)]
    if any(table for _, table in calibrated):
        figure, axes = plt.subplots(1, len(calibrated), figsize=(5 * len(calibrated), 4), squeeze=False)
        for axis, (label, table) in zip(axes[0], calibrated):
            draw_calibration(axis, table, f"draft calibration, {label}")
        paths.append(_save(figure, out_dir, "calibration.png"))
    return paths


def _speedups(plt, settings: List[dict], labels: List[str]):
    """Decode and whole-path speedup by duration bucket, with 95% intervals."""
    figure, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for axis, part in zip(axes, ("decode", "whole")):
        for offset, (label, setting) in enumerate(zip(labels, settings)):
            buckets = setting["summary"]["buckets"]
            names = list(buckets)
            values = [buckets[n][part]["speedup"] for n in names]
            errors = [
                [v - buckets[n][part]["low"] for n, v in zip(names, values)],
                [buckets[n][part]["high"] - v for n, v in zip(names, values)],
            ]
            width = 0.8 / len(settings)
            positions = [i + offset * width for i in range(len(names))]
            axis.bar(positions, values, width, yerr=errors, capsize=3, label=label)
            axis.set_xticks([i + 0.4 - width / 2 for i in range(len(names))], names)
        axis.axhline(1.0, color="black", linewidth=0.8)
        axis.set_title(f"{part} speedup by duration (s), 95% CI")
        axis.set_xlabel("utterance duration bucket")
    axes[0].set_ylabel("faster-whisper time / ct2-flash time")
    axes[0].legend()
    return figure


def _acceptance(plt, settings: List[dict], labels: List[str]):
    """How often a draft at each position was accepted, given it was proposed."""
    figure, axis = plt.subplots(figsize=(6, 4))
    for label, setting in zip(labels, settings):
        by_position = [v for v in setting["summary"]["acceptance_by_position"] if v is not None]
        axis.plot(range(1, len(by_position) + 1), by_position, marker="o", label=label)
    axis.set_xlabel("draft position j")
    axis.set_ylabel("P(draft j accepted | proposed)")
    axis.set_ylim(0, 1)
    axis.set_title("acceptance by draft position")
    axis.legend()
    return figure


def _time_split(plt, settings: List[dict], labels: List[str]):
    """Each system's seconds by part, stacked, the rest of the whole path last."""
    rows, names = [], []
    for label, setting in zip(labels, settings):
        for system, summary in setting["summary"]["systems"].items():
            rows.append(summary["time_split_seconds"])
            names.append(f"{label}\n{SYSTEM_NAMES[system]}")
    figure, axis = plt.subplots(figsize=(9, 1.2 + 0.45 * len(rows)))
    seen = list(dict.fromkeys(part for row in rows for part in row))
    parts = [p for p in seen if p != "rest of whole path"] + ["rest of whole path"]
    for part in parts:
        lefts = [sum(v for p, v in row.items() if parts.index(p) < parts.index(part)) for row in rows]
        axis.barh(range(len(rows)), [row.get(part, 0.0) for row in rows], left=lefts, label=part)
    axis.set_yticks(range(len(rows)), names)
    axis.invert_yaxis()
    axis.set_xlabel("seconds (sum over utterances, median over repeats)")
    axis.set_title("where the time goes")
    axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return figure


def draw_calibration(axis, table: List[List[dict]], title: str) -> None:
    """Predicted (the drafter's probability, bin centre) against observed acceptance, for the
    first four draft positions; ``table`` as ``runner.calibration_cells`` gives it."""
    for position, cells in enumerate(table[:4]):
        points = [(c["confidence"], c["observed"]) for c in cells if c["observed"] is not None and c["judged"] >= 5]
        if points:
            axis.plot(*zip(*points), marker="o", label=f"position {position + 1}")
    axis.plot([0, 1], [0, 1], color="black", linewidth=0.8, linestyle="--", label="calibrated")
    axis.set_xlabel("drafter's probability of its token (bin centre)")
    axis.set_ylabel("observed acceptance (bins with >= 5 judged)")
    axis.set_title(title, fontsize=9)
    axis.legend(fontsize=7)


def _save(figure, out_dir: str, name: str) -> str:
    import matplotlib.pyplot as plt

    path = os.path.join(out_dir, name)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
