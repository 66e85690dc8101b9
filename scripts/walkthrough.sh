#!/usr/bin/env bash
# The walkthrough on the shipped tiny model: every step is a real `invar` command, and every run keeps its records.
# Run through `make walkthrough` (which installs first); the runs land in runs/walkthrough-<time>/.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
out="${INVAR_WALKTHROUGH_OUT:-runs/walkthrough-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$out"
step() { printf '\n\033[1m== %s\033[0m\n$ %s\n' "$1" "${*:2}"; "${@:2}"; }

step "1. One inference call on the Hugging Face engine (greedy): tokens, text, log-probabilities" \
  invar infer "37+58=" "12*7=" "305-187=" --temperature 0 --run "$out/infer-hf"
step "2. The same prompts sampled at temperature 1 on vLLM, with per-request seeds" \
  invar infer "37+58=" "12*7=" "305-187=" --engine vllm --seed 7 --run "$out/infer-vllm"
step "3. The shipped model (FP32) on a seeded sample of the evaluation population, scored by the core" \
  invar evaluate --count 500 --temperature 0 --run "$out/eval-fp32"
step "4. The same sample with the weights quantized to NF4 (the candidate of the example contract)" \
  invar evaluate --count 500 --temperature 0 --quantization nf4 --run "$out/eval-nf4"
step "5. Turn the owner's declaration into a canonical use contract" \
  invar use prepare contracts/arith-nf4.toml --out "$out"
step "6. How many prompts each bound needs to admit, if 1% get worse and 1% get better" \
  invar use plan "$out/arith-nf4.contract.json" --assume "worse=0.01 better=0.01"
step "7. Every record of step 4 re-verified: digests, chain, and each report bound to its call" \
  invar inspect records "$out/eval-nf4"
printf '\nRecords of every step are in %s/\n' "$out"
