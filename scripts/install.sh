#!/usr/bin/env bash
# Install ct2-flash into ./.venv (or the active virtual environment).
#
# Order matters: the metadata-only 'ctranslate2' package (packaging/ctranslate2) goes in
# first, so that faster-whisper's 'ctranslate2' requirement is met by the patched runtime
# and pip never installs stock ctranslate2 over it.
#
#   bash scripts/install.sh          # the library and its command-line tool
#   bash scripts/install.sh --test   # plus the test dependencies
set -euo pipefail
cd "$(dirname "$0")/.."

extras=""
if [[ "${1:-}" == "--test" ]]; then
  extras="[test]"
fi

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
