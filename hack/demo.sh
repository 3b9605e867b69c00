#!/usr/bin/env bash
# make demo: GSPO on SmolLM2-135M-Instruct against the math task app, CPU only, on this machine: the RL job
# from the base model with a held-out evaluation before and after, and the reward curve (--sft-warmup chains a
# short SFT job in first; --task agent runs the multi-step craftworld variant, examples/demo/agent.toml).
# Everything runs under .runs/demo/; every process is stopped at the end, on Ctrl-C, on SIGTERM and on failure.
# Arguments go to `python -m posttrain.local.demo` (make demo DEMO_ARGS="...").
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python -m posttrain.local.demo "$@"
