#!/usr/bin/env bash
# make demo: GSPO on SmolLM2-135M-Instruct against the math task app, CPU only, on this machine:
# an SFT warm-up job chained into the RL job (FFT-first), the reward curve, and a held-out evaluation of the
# base and the fine-tuned model. Everything runs under .runs/demo/ and every process is stopped at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python -m posttrain.local.demo "$@"
