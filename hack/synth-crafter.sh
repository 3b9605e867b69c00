#!/usr/bin/env bash
# synth's own Crafter task app, unchanged, needs synth-ai 0.2.19 and crafter from PyPI. Their dependencies
# (modal, pyboy, google-genai, ... about 1.2 GB) are not ours and pin things our venv pins otherwise, so
# they go into a venv of their own in the cache outside the clone ($POSTTRAIN_CACHE, default
# ~/.cache/posttrain/synth-crafter-<version>/), made once (uv resolves it in about a minute) and reused:
# a venv with its .ready marker is not touched again. Prints the venv's python.
set -euo pipefail
cd "$(dirname "$0")/.."

SYNTH_VERSION=${SYNTH_VERSION:-0.2.19}
CRAFTER_VERSION=${CRAFTER_VERSION:-1.8.3}
CACHE=${POSTTRAIN_CACHE:-$HOME/.cache/posttrain}
OUT=$CACHE/synth-crafter-$SYNTH_VERSION
PY=${PYTHON:-$(command -v python3.11 || command -v python3)}

if [ ! -f "$OUT/.ready" ]; then
  echo "installing synth-ai $SYNTH_VERSION and crafter $CRAFTER_VERSION into $OUT (cold: a few minutes; cached afterwards)" >&2
  start=$(date +%s)
  rm -rf "$OUT"  # an interrupted install (no .ready) starts over
  "$PY" -m venv "$OUT"
  "$OUT/bin/python" -m pip install -q --upgrade pip uv >&2
  # uv, not pip: pip's resolver backtracks for many minutes over synth-ai's long dependency list
  VIRTUAL_ENV="$OUT" "$OUT/bin/uv" pip install -q --python "$OUT/bin/python" \
    "synth-ai==$SYNTH_VERSION" "crafter==$CRAFTER_VERSION" >&2
  touch "$OUT/.ready"
  echo "synth-ai installed in $(( $(date +%s) - start )) s" >&2
fi
echo "$OUT/bin/python"
