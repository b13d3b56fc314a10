"""Markdown tables from ``ct2-flash bench`` JSON files (what the README shows).

python bench/summarize.py bench/results/real_speech/bench.json [...]
"""

from __future__ import annotations

import json
import sys


def _interval(entry: dict) -> str:
    return f"{entry['speedup']:.2f}x [{entry['low']:.2f}, {entry['high']:.2f}]"


def _versus(section: dict, name: str) -> str:
    """ "decode / whole" against stock system ``name`` ("stock", "tuned_stock"), "-" without it."""
    versus = section.get(f"speedup_vs_{name}")
    return f"{versus['decode']['speedup']:.2f}x / {versus['whole']['speedup']:.2f}x" if versus else "-"


def table(path: str) -> str:
    with open(path, encoding="utf-8") as stream:
        document = json.load(stream)
    lines = [
        f"`{path}`",
        "",
        "| setting | utt. | audio s | decode speedup [95% CI] | whole path | vs stock (decode / whole) "
        "| vs tuned stock | identical | acceptance | first pos. | tokens/call | WER fw / flash |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for setting in document["settings"]:
        summary = setting["summary"]
        systems = summary["systems"]
        wer = [systems[s]["wer"] for s in ("baseline", "flash")]
        wer_text = " / ".join(f"{w:.1%}" if w is not None else "-" for w in wer)
        identity = summary["token_identity"]

        def rate(value):
            return f"{value:.1%}" if value is not None else "-"

        def number(value):
            return f"{value:.2f}" if value is not None else "-"

        lines.append(
            f"| {setting['compute_type']}, {setting['threads']} thr | {summary['utterances']} | {number(summary['audio_seconds'])} "
            f"| {_interval(summary['speedup']['decode'])} | {_interval(summary['speedup']['whole'])} "
            f"| {_versus(summary, 'stock')} | {_versus(summary, 'tuned_stock')} "
            f"| {identity['identical']}/{identity['of']} | {rate(summary['acceptance_rate'])} "
            f"| {rate(summary['first_position_acceptance'])} | {number(summary['tokens_per_target_call'])} | {wer_text} |"
        )
        for section in setting.get("batched", []):
            identity = section["token_identity"]
            lines.append(
                f"| ↳ batched, batch {section['batch_size']} | | | {_interval(section['speedup']['decode'])} "
                f"| {_interval(section['speedup']['whole'])} | {_versus(section, 'stock')} "
                f"| {_versus(section, 'tuned_stock')} | {identity['identical']}/{identity['of']} | | | | |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    print("\n\n".join(table(path) for path in sys.argv[1:]))
