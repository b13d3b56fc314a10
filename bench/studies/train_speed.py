"""Drafter training speed: wall time per 1,000 updates, by what a step reads and computes.

Times ``fit``'s own update (``train_step``, batch assembly included) on the cached teacher
data, after warm-up, for: all 1,500 encoder frames with the greedy-token loss (how training
ran before), the window's audio frames plus one second (as the runtime drafter reads them),
batches of utterances of similar length (``sample_batch``, as ``fit`` draws them), and that
plus distillation of the target's top-16 distribution. Pause background jobs first: the two cores are shared.

    python bench/studies/train_speed.py --steps 20 --out bench/results/train_speed.json
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

from ct2_flash.benchmark.scripts import machine, write_result


def main() -> None:
    import numpy as np
    import torch

    from ct2_flash.adapter.whisper_model import FlashWhisperModel
    from ct2_flash.drafting.flash_drafter import target_identity
    from ct2_flash.drafting.flash_model import DrafterConfig, FlashDrafterModel
    from ct2_flash.engine.model_files import CT2ModelFile
    from ct2_flash.engine.models import resolve_model
    from ct2_flash.train.__main__ import default_data_dir
    from ct2_flash.train.fit import (
        IGNORE,
        FitConfig,
        batch_frames,
        load_examples,
        make_batch,
        order_by_length,
        sample_batch,
        shortlist_from,
        train_step,
    )

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=default_data_dir())
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    model_path = resolve_model("tiny.en")
    examples = load_examples(args.data, "train")
    if len(examples) < args.batch_size:
        raise SystemExit(
            f"need >= {args.batch_size} extracted training utterances in {args.data}, have {len(examples)}"
        )
    special = FlashWhisperModel(model_path, stock_engine=False, compute_type="float32").decoder.runtime.special
    shortlist = shortlist_from(examples, 8192, special)
    everything = [dataclasses.replace(e, audio_frames=None) for e in examples]
    # name -> (utterances, distillation weight, batches of similar length)
    systems = {
        "all 1,500 frames, greedy-token loss": (everything, 0.0, False),
        "audio frames + 1 s, greedy-token loss": (examples, 0.0, False),
        "audio frames + 1 s, batches by length, greedy-token loss": (examples, 0.0, True),
        "audio frames + 1 s, batches by length, greedy-token + distillation (0.5)": (examples, 0.5, True),
    }
    results = {}
    for name, (pool, kl_weight, bucketed) in systems.items():
        config = FitConfig(steps=10**6, batch_size=args.batch_size, kl_weight=kl_weight)
        model = FlashDrafterModel(
            DrafterConfig(target=target_identity(model_path, "tiny.en"), shortlist_size=len(shortlist))
        )
        model.init_from_target(CT2ModelFile(model_path))
        model.shortlist.copy_(torch.from_numpy(shortlist))
        model.train()
        full_to_short = torch.full((special.vocab_size,), IGNORE, dtype=torch.long)
        full_to_short[model.shortlist] = torch.arange(len(model.shortlist))
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config.learning_rate)
        seconds, frames = [], []
        by_length = order_by_length(pool)
        for step in range(args.warmup + args.steps):
            rng = np.random.default_rng([0, step])  # the same batches for every system
            indices = (
                sample_batch(by_length, args.batch_size, rng) if bucketed else rng.choice(len(pool), args.batch_size)
            )
            chosen = [pool[i] for i in indices]
            started = time.perf_counter()
            batch = make_batch(chosen, model.config.num_draft_tokens, config.blocks_per_utterance, rng)
            train_step(model, optimizer, batch, full_to_short, config, step)
            if step >= args.warmup:
                seconds.append(time.perf_counter() - started)
                frames.append(batch_frames(chosen, 1500))
        results[name] = {
            "seconds_per_update": statistics.fmean(seconds),
            "minutes_per_1000_updates": statistics.fmean(seconds) * 1000 / 60,
            "mean_encoder_frames": statistics.fmean(frames),
        }
        print(name, {k: round(v, 3) for k, v in results[name].items()})
    document = {
        "what": "drafter training wall time per update (batch loading + forward + backward + AdamW)",
        "utterances": len(examples),
        "batch_size": args.batch_size,
        "blocks_per_utterance": 16,
        "threads": args.threads,
        "steps_timed": args.steps,
        "machine": machine(),
        "results": results,
    }
    write_result(args.out, document)


if __name__ == "__main__":
    main()
