#!/usr/bin/env bash
# Install ct2-flash into ./.venv (or the active virtual environment).
#
# Order matters: the metadata-only 'ctranslate2' package (packaging/ctranslate2) goes in
# first, so that faster-whisper's 'ctranslate2' requirement is met by the patched runtime
# and pip never installs stock ctranslate2 over it.
#
#   bash scripts/install.sh            # the library and its command-line tool
#   bash scripts/install.sh --test     # plus the test dependencies
#   bash scripts/install.sh --clients  # plus the pinned faster-whisper clients (packaging/clients.txt)
#   bash scripts/install.sh --ray      # plus Ray Data, for ct2-flash transcribe --ray
set -euo pipefail
cd "$(dirname "$0")/.."

extras=""
clients=0
ray=0
for arg in "$@"; do
  case "$arg" in
    --test) extras="[test]" ;;
    --clients) clients=1 ;;
    --ray) ray=1 ;;
    *) echo "usage: bash scripts/install.sh [--test] [--clients] [--ray]" >&2; exit 2 ;;
  esac
done

if [[ -z "${VIRTUAL_ENV:-}" ]]; then
  if [[ ! -x .venv/bin/python ]]; then
    python3 -m venv .venv
  fi
  PY=.venv/bin/python
else
  PY="$VIRTUAL_ENV/bin/python"
fi

"$PY" -m pip install --quiet --upgrade pip
"$PY" -m pip install --quiet ./packaging/ctranslate2
"$PY" -m pip install --quiet -e ".${extras}"
"$PY" -m pip check
"$PY" -c "import ct2_flash" # fails with the fix if the runtime is not the patched one
# Stock ctranslate2 for the worker (FlashWhisperModel(stock_engine=True)), in a private
# directory of the environment: never on its import path, so the patched runtime stays.
"$PY" -m ct2_flash.stock >/dev/null

# tcmalloc for the stock engine's worker (ct2_flash/stock/allocator.py): installed from the
# system's packages where this runs as root with apt-get; otherwise a note says how, and the
# worker runs glibc's allocator (the same tokens, a slower decode).
if ! "$PY" -c "import sys; from ct2_flash.stock.allocator import find_tcmalloc; sys.exit(find_tcmalloc() is None)"; then
  if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null; then
    echo "install.sh: installing tcmalloc for the stock engine's worker (apt-get install libgoogle-perftools4)"
    apt-get install -y -q libgoogle-perftools4 >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q libgoogle-perftools4 >/dev/null 2>&1; } \
      || echo "install.sh: could not install libgoogle-perftools4; the worker runs glibc's allocator" >&2
  else
    echo "install.sh: tcmalloc is not installed; the stock engine's worker runs glibc's allocator" \
         "(faster: apt-get install libgoogle-perftools4, or dnf install gperftools-libs)" >&2
  fi
fi

if [[ "$clients" == 1 ]]; then
  # The clients ct2-flash run is tested under, in this environment (they run in its
  # interpreter). Their own requirements name faster-whisper and numpy loosely: ct2-flash's
  # installed versions are held as constraints, so that no client replaces them.
  constraints="$(mktemp)"
  trap 'rm -f "$constraints"' EXIT
  "$PY" -m pip freeze | grep -iE '^(faster-whisper|ctranslate2-crisperwhisper|numpy|av|onnxruntime|tokenizers|huggingface[-_]hub)==' >"$constraints"
  "$PY" -m pip install --quiet -r packaging/clients.txt -c "$constraints"
  "$PY" -m pip check
  "$PY" -c "import ct2_flash"
fi

if [[ "$ray" == 1 ]]; then
  # Ray Data for ct2-flash transcribe --ray (the [ray] extra), holding ct2-flash's installed
  # numpy and engine as constraints, as for the clients.
  constraints="$(mktemp)"
  trap 'rm -f "$constraints"' EXIT
  "$PY" -m pip freeze | grep -iE '^(faster-whisper|ctranslate2-crisperwhisper|numpy|av|onnxruntime)==' >"$constraints"
  "$PY" -m pip install --quiet -e ".[ray]" -c "$constraints"
  "$PY" -m pip check
  "$PY" -c "import ct2_flash, ray.data"
fi
