"""Fine-tuning updates per second with and without bfloat16 autocast (``FitConfig.bf16``).

Times ``train_step`` (forward, backward, AdamW) of the shipped drafter on batches of an
adaptation's own teacher data (``ct2-flash adapt``'s work directory), float32 and bf16
alternating twice, after three warm-up updates each; batch assembly is done beforehand. On a
CPU without bf16 instructions autocast emulates it (slower). Pause background jobs first.

    python bench/studies/train_bf16.py --work ~/.cache/ct2_flash/adapt/asterisk_float32.adapt \
        --out bench/results/adapt/bf16.json
"""

from __future__ import annotations

import argparse

from ct2_flash.benchmark.scripts import timed, write_result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", required=True, help="an adaptation's work directory (OUT.adapt)")
    parser.add_argument("--updates", type=int, default=22)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="bench/results/adapt/bf16.json")
    args = parser.parse_args()
    import numpy as np
    import torch

    from ct2_flash.drafting.files import SHIPPED_DRAFTERS
    from ct2_flash.drafting.flash_drafter import load_checkpoint
    from ct2_flash.engine.models import resolve_model
    from ct2_flash.train.fit import (
        IGNORE,
        FitConfig,
        load_examples,
        make_batch,
        order_by_length,
        sample_batch,
        train_step,
    )

    torch.set_num_threads(args.threads)
    examples = load_examples(args.work, "train")
    by_length = order_by_length(examples)
    runs = {"float32": [], "bf16": []}
    for bf16 in (False, True, False, True):
        model = load_checkpoint(f"{SHIPPED_DRAFTERS}/tiny.en", resolve_model("tiny.en"))
        model.train()
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
        full_to_short = torch.full((model.config.target.vocab_size,), IGNORE, dtype=torch.long)
        full_to_short[model.shortlist] = torch.arange(len(model.shortlist))
        config = FitConfig(steps=1000, warmup_steps=5, bf16=bf16)
        batches = [
            make_batch(
                [examples[i] for i in sample_batch(by_length, 8, np.random.default_rng([0, s]))],
                8,
                16,
                np.random.default_rng([0, s]),
                config.audio_window,
            )
            for s in range(args.updates + 3)
        ]
        for step in range(3):
            train_step(model, optimizer, batches[step], full_to_short, config, step)
        seconds, losses = timed(
            lambda model=model, optimizer=optimizer, batches=batches, full_to_short=full_to_short, config=config: [
                train_step(model, optimizer, batches[step], full_to_short, config, step)
                for step in range(3, args.updates + 3)
            ]
        )
        runs["bf16" if bf16 else "float32"].append(
            {"updates_per_second": args.updates / seconds, "mean_loss": float(np.mean(losses))}
        )
    summary = {name: max(r["updates_per_second"] for r in result) for name, result in runs.items()}
    write_result(
        args.out,
        {
            "work": args.work,
            "runs": runs,
            "best_updates_per_second": summary,
            "bf16_speedup": summary["bf16"] / summary["float32"],
        },
        echo=("best_updates_per_second", "bf16_speedup"),
    )


if __name__ == "__main__":
    main()
