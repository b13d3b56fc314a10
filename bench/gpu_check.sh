#!/usr/bin/env bash
# bench/gpu_check.py on a machine with an NVIDIA GPU and no network, such as the device
# machines lent to some of these sessions (their Python 3.12 has numpy, onnxruntime, tokenizers,
# huggingface_hub, threadpoolctl and tqdm, but no ctranslate2, faster-whisper or PyAV):
#
#   here:  bash bench/gpu_check.sh bundle DIR        (PYTHON_VERSION: the GPU machine's, default 3.12)
#   there: bash bench/gpu_check.sh run DIR OUT.json
#
# The bundle (DIR/bundle.tar, ~96 MB) holds the patched runtime and faster-whisper built for that
# Python, tiny.en, and 24 real clips of the mfa speech set as arrays (the check decodes no file:
# a stand-in `av` module satisfies faster-whisper's import of PyAV). The runtime's CUDA build
# loads cuBLAS 12 (libcublas.so.12); on a machine that has only CUDA 13's cuBLAS, `run` links
# that name to libcublas.so.13 (every cuBLAS function CTranslate2 calls is in both), and the
# result records which library it loaded.
set -euo pipefail
cd "$(dirname "$0")/.."

case "${1:-}" in
bundle)
  dir=$2
  PY=${PY:-.venv/bin/python}
  mkdir -p "$dir"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  version() { "$PY" -m pip show "$1" | awk '/^Version:/{print $2}'; }
  "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version "${PYTHON_VERSION:-3.12}" \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux2014_x86_64 \
    -d "$tmp/wheels" "ctranslate2-crisperwhisper==$(version ctranslate2-crisperwhisper)" \
    "faster-whisper==$(version faster-whisper)"
  mkdir -p "$tmp/pack/site"
  for wheel in "$tmp"/wheels/*.whl; do "$PY" -m zipfile -e "$wheel" "$tmp/pack/site"; done
  model=$("$PY" -c 'from ct2_flash import resolve_model; print(resolve_model("tiny.en"))')
  cp -r "$model" "$tmp/pack/model"
  "$PY" bench/gpu_check.py --write-clips "$tmp/pack/clips.npz" --speech-set mfa --limit 24
  tar cf - -C "$tmp/pack" . | xz -T0 -6 >"$dir/bundle.tar.xz"
  ls -l "$dir/bundle.tar.xz"
  ;;
run)
  dir=$2
  out=$3
  work=$(mktemp -d)
  python3 -c 'import lzma, sys, tarfile; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])' \
    "$dir/bundle.tar.xz" "$work"
  mkdir -p "$work/site/av" "$work/lib"
  echo '"""Stand-in for PyAV: the GPU check passes arrays, never files."""' >"$work/site/av/__init__.py"
  if command -v nvidia-smi >/dev/null && ! ldconfig -p | grep -q 'libcublas\.so\.12 '; then
    cublas=$(find / -xdev \( -name 'libcublas.so.12' -o -name 'libcublas.so.13' \) 2>/dev/null | sort | head -1)
    [ -n "$cublas" ] || { echo "no cuBLAS 12 or 13 on this machine" >&2; exit 1; }
    ln -s "$cublas" "$work/lib/libcublas.so.12"
    echo "cuBLAS: libcublas.so.12 -> $cublas"
    export GPU_CHECK_CUBLAS="$cublas"
  fi
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  LD_LIBRARY_PATH="$work/lib:${LD_LIBRARY_PATH:-}" PYTHONPATH="$work/site:$PWD" PYTHONUNBUFFERED=1 \
    "${PY:-python3}" bench/gpu_check.py --clips "$work/clips.npz" --model "$work/model" --out "$out" "${@:4}"
  ;;
*)
  echo "usage: bash bench/gpu_check.sh bundle DIR | run DIR OUT.json [gpu_check.py options]" >&2
  exit 2
  ;;
esac
