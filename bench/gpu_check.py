"""ct2-flash on a GPU: whether its output is faster-whisper's there, and what the loop costs.

Three parts (``--parts``). ``dropin``: the default ``FlashWhisperModel`` as a user builds it
(``device="auto"``) against faster-whisper's ``WhisperModel``, every segment field under
``DROPIN_OPTIONS`` and through ``BatchedInferencePipeline``, per ``--dropin-compute-types``.
``redecodes``: a streaming client's re-decodes of growing buffers (``redecode_check``).
``loop``: per ``--compute-types``, on one CUDA device, four systems transcribe every clip greedily
(``beam_size=1``, timestamps on, ``temperature=0``: no sampled fallback, whose draws would
differ between any two runs), in turn clip by clip, ``--repeats`` times:

- ``faster-whisper``: its ``WhisperModel``, the reference;
- ``default``: ``FlashWhisperModel`` as a user builds it; on a GPU every call goes to
  ``generate()`` unless ``near_exact`` opts in to the loop;
- ``loop``: ``FlashWhisperModel(near_exact=True)`` with every call in the loop and the
  users' settings inside it (the draft pause, the draft lengths);
- ``loop, every round``: the same with every round drafting (``adaptive=False``), the setting
  that tests exactness hardest.

Reported per system: clips whose tokens equal faster-whisper's, summed times (whole path:
waveform to segments; the ``encode`` and ``generate`` calls inside it), tokens per target
call of the loop; and the device's cost of one decoder step and of one 9-row verification.
A batched transcription (``BatchedInferencePipeline``, 4 rows a call) checks the loop's
multi-row path. A part that fails records its error and the rest still runs.

On the machine with the GPU (nothing to download there: the clips come in a file):

    python bench/gpu_check.py --clips CLIPS.npz --model MODEL_DIR --out bench/results/gpu/check.json

Here, the clips to carry there (16 kHz, int16), and a dry run of the whole check on the CPU:

    python bench/gpu_check.py --write-clips CLIPS.npz --speech-set mfa --limit 24
    python bench/gpu_check.py --clips CLIPS.npz --device cpu --compute-types float32 --out /tmp/check.json
"""

from __future__ import annotations

import argparse
import os
import traceback
from typing import Callable, Dict, List

import ctranslate2
import numpy as np
from faster_whisper import BatchedInferencePipeline as FasterBatched
from faster_whisper import WhisperModel
from redecodes import buffer_ends, pieces

from ct2_flash import BatchedInferencePipeline, FlashWhisperModel, resolve_model
from ct2_flash.adapter.routing import CallRouter
from ct2_flash.benchmark.measure import measure
from ct2_flash.benchmark.scripts import median_ms, write_result
from ct2_flash.drafting.files import SHIPPED_DRAFTERS

SAMPLE_RATE = 16000
# Greedy with timestamps, no sampled fallback (its draws would differ between any two runs).
GREEDY = dict(beam_size=1, temperature=0.0)


class AlwaysLoop(CallRouter):
    def use_loop(self, batch_size: int) -> bool:
        return True


def write_clips(path: str, speech_set: str, limit: int) -> None:
    """The first ``limit`` clips of a fetched speech set as 16 kHz int16 arrays, by file name."""
    from ct2_flash.benchmark.manifest import read_manifest
    from ct2_flash.benchmark.runner import load_audio
    from ct2_flash.benchmark.speech_sets import fetch

    audio = load_audio(read_manifest(fetch(speech_set))[:limit])
    arrays = {
        os.path.basename(path): np.round(np.clip(samples, -1, 1) * 32767).astype(np.int16)
        for path, samples in audio.items()
    }
    np.savez_compressed(path, **arrays)
    seconds = sum(len(a) for a in arrays.values()) / SAMPLE_RATE
    print(f"{len(arrays)} clips, {seconds:.0f} s of {speech_set} -> {path}")


def read_clips(path: str) -> Dict[str, np.ndarray]:
    with np.load(path) as data:
        return {name: data[name].astype(np.float32) / 32767 for name in sorted(data.files)}


def guarded(record: dict, name: str, part: Callable[[], object]) -> None:
    """Run one part of the check; its result, or its error, goes into ``record[name]``."""
    try:
        record[name] = part()
    except Exception as error:  # one failing part must not lose the others' figures
        record[name] = {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()}


def compare(models: Dict[str, object], clips: Dict[str, np.ndarray], repeats: int) -> dict:
    """Every system on every clip in turn, ``repeats`` times; per clip each system's fastest
    run counts, and its tokens against the first system's."""
    first = next(iter(models))
    for model in models.values():  # warm-up: the device's first calls load kernels
        measure(model, next(iter(clips.values())), **GREEDY)
    totals = {name: zero_totals() for name in models}
    different: Dict[str, List[str]] = {name: [] for name in models}
    for clip, audio in clips.items():
        runs: Dict[str, list] = {name: [] for name in models}
        for _ in range(repeats):
            for name, model in models.items():
                runs[name].append(measure(model, audio, **GREEDY))
        for name in models:
            best = min(runs[name], key=lambda run: run.whole_seconds)
            add(totals[name], best)
            if best.tokens != runs[first][0].tokens:
                different[name].append(clip)
    return {
        name: {
            "identical": len(clips) - len(different[name]),
            "clips": len(clips),
            "different": different[name],
            **rounded(totals[name]),
        }
        for name in models
    }


def zero_totals() -> dict:
    """Running sums of ``Measurement`` fields, before the first (``add``)."""
    return {"whole_s": 0.0, "encode_s": 0.0, "generate_s": 0.0, "tokens": 0}


def add(total: dict, run) -> None:
    """Add one ``Measurement`` to running sums."""
    total["whole_s"] += run.whole_seconds
    total["encode_s"] += run.encode_seconds
    total["generate_s"] += run.decode_seconds
    total["tokens"] += sum(len(tokens) for tokens in run.tokens)


def rounded(total: dict) -> dict:
    return {key: round(value, 4) if isinstance(value, float) else value for key, value in total.items()}


def loop_counters(model) -> dict:
    stats = model.spec_stats
    return {
        "target_calls": stats.target_calls,
        "emitted": stats.emitted,
        "proposed": stats.proposed,
        "accepted": stats.accepted,
        "rows_rechecked": stats.rows_rechecked,
        "fallback_calls": stats.unchanged_calls,
        "generate_rows": stats.rows_in_generate,
        "tokens_per_target_call": round(stats.emitted / max(stats.target_calls, 1), 3),
        **{f"{part}_s": round(getattr(stats, f"{part}_seconds"), 4) for part in ("drafter", "verify", "other")},
    }


def pass_costs(model, audio: np.ndarray, repeats: int) -> dict:
    """Median ms of one decoder step and of one 9-row verification (each rolled back), on
    the device, from one window's encoder output."""
    runtime = model.model.decoder.runtime
    features = model.window_features(audio)[None]
    encoded = runtime.model.encode(ctranslate2.StorageView.from_array(np.ascontiguousarray(features)))
    sequence = runtime.start(encoded, [runtime.special.sot]).sequence
    length = sequence.length
    tokens = [runtime.special.timestamp_begin, 383, 3290, 1364, 379, 10891, 13, 50364, 50257]

    def verify(count: int) -> Callable[[], None]:
        def once() -> None:
            sequence.verify(tokens[:count])
            sequence.rollback(length)

        return once

    return {"step_ms": round(median_ms(verify(1), repeats), 3), "verify_9_ms": round(median_ms(verify(9), repeats), 3)}


def batched(models: Dict[str, object], audio: np.ndarray) -> dict:
    """A long recording through each system's ``BatchedInferencePipeline``, 4 rows a call."""
    pipelines = {"faster-whisper": FasterBatched, "loop": BatchedInferencePipeline}
    outputs = {}
    for name, pipeline in pipelines.items():
        segments, _ = pipeline(model=models[name]).transcribe(
            audio, beam_size=1, batch_size=4, temperature=0.0, without_timestamps=False
        )
        outputs[name] = [list(segment.tokens) for segment in segments]
    return {
        "identical": outputs["loop"] == outputs["faster-whisper"],
        "segments": len(outputs["faster-whisper"]),
        "loop_counters": loop_counters(models["loop"]),
    }


def check(args, compute_type: str, clips: Dict[str, np.ndarray]) -> dict:
    model_path = resolve_model(args.model)
    common = dict(device=args.device, compute_type=compute_type, cpu_threads=args.cpu_threads)
    flash = dict(common, drafter=args.drafter, redecodes=False)
    record: dict = {}
    models = {
        "faster-whisper": WhisperModel(model_path, **common),
        "default": FlashWhisperModel(model_path, **flash),
        "loop": FlashWhisperModel(model_path, **flash, near_exact=True, call_router=AlwaysLoop()),
        "loop, every round": FlashWhisperModel(model_path, **flash, near_exact=True, adaptive=False),
    }
    record["default_inexact_reason"] = models["default"].model.inexact_reason
    guarded(record, "systems", lambda: compare(models, clips, args.repeats))
    record["counters"] = {name: loop_counters(model) for name, model in models.items() if name != "faster-whisper"}
    first = next(iter(clips.values()))
    guarded(record, "passes", lambda: pass_costs(models["loop"], first, args.pass_repeats))
    long_audio = np.concatenate(list(clips.values()))[: 120 * SAMPLE_RATE]
    models["loop"].reset_spec_stats()
    guarded(record, "batched", lambda: batched(models, long_audio))
    return record


def segments_of(model, audio: np.ndarray, **options) -> list:
    """Everything of a transcription a client can see: per segment its tokens, times, scores,
    temperature and words. CTranslate2 is seeded first, so that a sampled fallback draws the
    same on both systems when both make the same calls."""
    ctranslate2.set_random_seed(1)
    segments, _ = model.transcribe(audio, **options)
    return [
        (
            tuple(s.tokens),
            s.start,
            s.end,
            s.avg_logprob,
            s.no_speech_prob,
            s.compression_ratio,
            s.temperature,
            [(w.word, w.start, w.end, w.probability) for w in s.words or ()],
        )
        for s in segments
    ]


# faster-whisper's options a client passes most, each checked on every clip; {} is its defaults
# (beam search, the temperature fallback).
DROPIN_OPTIONS = {
    "defaults": {},
    "greedy": {"beam_size": 1},
    "greedy, word timestamps": {"beam_size": 1, "word_timestamps": True},
    "greedy, VAD": {"beam_size": 1, "vad_filter": True},
}


def dropin_check(args, compute_type: str, clips: Dict[str, np.ndarray]) -> dict:
    """The default ``FlashWhisperModel`` as a user builds it on a GPU (``device="auto"``, the
    compute type given) against faster-whisper's ``WhisperModel``: every segment field,
    under each of ``DROPIN_OPTIONS`` and through ``BatchedInferencePipeline``."""
    model_path = resolve_model(args.model)
    common = dict(device="auto", compute_type=compute_type, cpu_threads=args.cpu_threads)
    reference = WhisperModel(model_path, **common)
    flash = FlashWhisperModel(model_path, **common, drafter=args.drafter)
    record: dict = {
        "device": flash.model.device,
        "compute_type": flash.model.compute_type,
        "inexact_reason": flash.model.inexact_reason,
    }
    for name, options in DROPIN_OPTIONS.items():
        different = [
            clip
            for clip, audio in clips.items()
            if segments_of(flash, audio, **options) != segments_of(reference, audio, **options)
        ]
        record[name] = {"identical": len(clips) - len(different), "clips": len(clips), "different": different}
    long_audio = np.concatenate(list(clips.values()))[: 120 * SAMPLE_RATE]
    batched_segments = [
        segments_of(pipeline(model=model), long_audio, batch_size=8)
        for pipeline, model in ((BatchedInferencePipeline, flash), (FasterBatched, reference))
    ]
    record["batched, defaults"] = {
        "identical": batched_segments[0] == batched_segments[1],
        "segments": len(batched_segments[1]),
    }
    record["counters"] = loop_counters(flash)
    return record


def redecode_check(args, compute_type: str, clips: Dict[str, np.ndarray]) -> dict:
    """A streaming client's re-decodes on the device: the clips joined into one stream (0.3 s
    apart, the first ``--redecode-seconds``), cut into pieces of up to 25 s, each piece
    transcribed as buffers ending at 2, 3, ... s by faster-whisper and by
    ``FlashWhisperModel(near_exact=True)`` (the previous hypothesis offered, the re-decode
    router), the two in turn piece by piece, in alternating order."""
    model_path = resolve_model(args.model)
    common = dict(device=args.device, compute_type=compute_type, cpu_threads=args.cpu_threads)
    models = {
        "faster-whisper": WhisperModel(model_path, **common),
        "loop": FlashWhisperModel(model_path, **common, drafter=args.drafter, near_exact=True),
    }
    flash = models["loop"]
    gap = np.zeros(int(0.3 * SAMPLE_RATE), np.float32)
    stream = np.concatenate([part for audio in clips.values() for part in (audio, gap)])
    stream = stream[: int(args.redecode_seconds * SAMPLE_RATE)]
    for model in models.values():  # warm-up
        measure(model, stream[: 5 * SAMPLE_RATE], **GREEDY)
    flash.reset_spec_stats()
    totals = {name: zero_totals() for name in models}
    identical = buffers = 0
    for index, piece in enumerate(pieces(stream, 25.0)):
        outputs = {}
        for name in list(models)[:: 1 if index % 2 == 0 else -1]:
            flash.forget_windows()  # each piece is a new stream
            outputs[name] = [measure(models[name], piece[:end], **GREEDY) for end in buffer_ends(piece, 2.0, 1.0)]
        for name, runs in outputs.items():
            for run in runs:
                add(totals[name], run)
        buffers += len(outputs["loop"])
        identical += sum(a.tokens == b.tokens for a, b in zip(outputs["loop"], outputs["faster-whisper"]))
    stats = flash.spec_stats
    return {
        "buffers": buffers,
        "identical": identical,
        "systems": {name: rounded(total) for name, total in totals.items()},
        "counters": dict(
            loop_counters(flash),
            redecodes=stats.redecodes,
            offered=stats.offered,
            offered_accepted=stats.offered_accepted,
            loop_rows=stats.rows_in_loop,
        ),
    }


def device_name(device: str) -> str:
    if device != "cuda":
        return "cpu"
    try:
        import torch

        return torch.cuda.get_device_name(0)
    except Exception:  # no PyTorch there: the count at least
        return f"{ctranslate2.get_cuda_device_count()} CUDA device(s)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write-clips", help="write the clips of --speech-set to this .npz and stop")
    parser.add_argument("--speech-set", default="mfa")
    parser.add_argument("--limit", type=int, default=24, help="clips written, or read")
    parser.add_argument("--clips", help=".npz of 16 kHz int16 clips (--write-clips)")
    parser.add_argument("--model", default="tiny.en", help="embedded model name or CTranslate2 model directory")
    parser.add_argument("--drafter", default=os.path.join(SHIPPED_DRAFTERS, "tiny.en"))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--compute-types", nargs="+", default=["float16", "float32"])
    parser.add_argument("--dropin-compute-types", nargs="+", default=["default", "int8_float16", "bfloat16"])
    parser.add_argument(
        "--parts", nargs="+", choices=["loop", "redecodes", "dropin"], default=["loop", "redecodes", "dropin"]
    )
    parser.add_argument("--redecode-seconds", type=float, default=120.0)
    parser.add_argument("--cpu-threads", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--pass-repeats", type=int, default=50)
    parser.add_argument("--out", default="bench/results/gpu/check.json")
    args = parser.parse_args()
    if args.write_clips:
        write_clips(args.write_clips, args.speech_set, args.limit)
        return
    if not args.clips:
        parser.error("--clips is needed (write it with --write-clips)")
    clips = dict(list(read_clips(args.clips).items())[: args.limit])
    document = {
        "command": "python bench/gpu_check.py --clips CLIPS.npz --parts "
        + " ".join(args.parts)
        + " --compute-types "
        + " ".join(args.compute_types)
        + " --dropin-compute-types "
        + " ".join(args.dropin_compute_types),
        "device": args.device,
        "device_name": device_name(args.device),
        "ctranslate2": ctranslate2.__version__,
        # gpu_check.sh's link where the machine has no cuBLAS 12 (None: the machine's own).
        "cublas": os.environ.get("GPU_CHECK_CUBLAS"),
        "clips": len(clips),
        "audio_seconds": round(sum(len(a) for a in clips.values()) / SAMPLE_RATE, 1),
        "repeats": args.repeats,
        "results": {},
    }
    if "loop" in args.parts:
        for compute_type in args.compute_types:
            guarded(document["results"], compute_type, lambda kind=compute_type: check(args, kind, clips))
            write_result(args.out, document)  # what is measured so far survives a later failure
    if "redecodes" in args.parts:
        document["redecodes"] = {}
        for compute_type in args.compute_types:
            guarded(document["redecodes"], compute_type, lambda kind=compute_type: redecode_check(args, kind, clips))
            write_result(args.out, document)
    if "dropin" in args.parts:
        document["dropin"] = {}
        for compute_type in args.dropin_compute_types:
            guarded(document["dropin"], compute_type, lambda kind=compute_type: dropin_check(args, kind, clips))
            write_result(args.out, document)
    write_result(args.out, document, echo=())


if __name__ == "__main__":
    main()
