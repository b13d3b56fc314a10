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
set -euo pipefail
cd "$(dirname "$0")/.."

extras=""
clients=0
for arg in "$@"; do
  case "$arg" in
    --test) extras="[test]" ;;
    --clients) clients=1 ;;
    *) echo "usage: bash scripts/install.sh [--test] [--clients]" >&2; exit 2 ;;
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
