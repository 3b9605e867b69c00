#!/usr/bin/env bash
# `make bench`: every benchmark prints its figures as ratios against a baseline run in the same process
# (TRL for the trainer, raw vLLM for the rollout proxy) or as absolute operator latencies. Not a test.
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p bench-results
status=0
for bench in hack/bench_*.py; do
  [ -e "$bench" ] || continue
  name=$(basename "$bench" .py)
  # the learning tests over 20 seeds take hours: `make bench-learning` runs it on its own
  [ "$name" = bench_learning_tests ] && continue
  echo "=== $name"
  if ! .venv/bin/python "$bench" 2>&1 | tee "bench-results/$name.txt"; then
    echo "!!! $name failed" >&2
    status=1
  fi
done
exit $status
