#!/usr/bin/env bash
# The walkthrough on the shipped tiny model: one whole use decision, every step a real `invar` command, every run
# keeping its records. Run through `make walkthrough` (which installs first); the runs land in
# runs/walkthrough-<time>/. docs/walkthrough.md explains each step's output.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
out="${INVAR_WALKTHROUGH_OUT:-runs/walkthrough-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$out"
step() { printf '\n\033[1m== %s\033[0m\n$ %s\n' "$1" "${*:2}"; "${@:2}"; }

step "1. One inference call on the Hugging Face engine (greedy): tokens, text, log-probabilities" \
  invar infer "37+58=" "12*7=" "305-187=" --temperature 0 --run "$out/infer-hf"
step "2. The shipped model on a seeded sample of the evaluation population, scored by the core" \
  invar evaluate --count 300 --temperature 0 --run "$out/eval-fp32"
step "3. The owner's declaration becomes a canonical use contract (its sha256 names it from now on)" \
  invar use prepare contracts/walkthrough.toml --out "$out"
step "4. How many prompts each bound needs to admit, if 1% of prompts get worse and 1% better" \
  invar use plan "$out/walkthrough.contract.json" --assume "worse=0.01 better=0.01" --method paired-binary-exact \
  --method maurer-pontil
contract="$out/walkthrough.contract.json"
run="$out/use-run"
printf '\n\033[1m== 5. Run the contract'"'"'s plan, and kill the run part-way (kill -9), as a crash would\033[0m\n'
printf '$ invar use run %s --run %s &   # then kill -9 once 8 of its 28 calls are answered\n' "$contract" "$run"
invar use run "$contract" --run "$run" > /dev/null 2>&1 &
pid=$!
# Wait (up to 10 minutes) until the run has answered 8 calls, reading its records as they are written.
for _ in $(seq 600); do
  python -c 'import sys
from invar.records import RunStore
with RunStore.open(sys.argv[1]) as s:
    done = sum(c.report is not None for c in s.calls() if c.call.method == "generate")
sys.exit(0 if done >= 8 else 1)' "$run" 2>/dev/null && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 1
done
kill -9 "$pid" 2>/dev/null || true
wait "$pid" 2>/dev/null || true
step "6. What the killed run kept: every record committed before the kill, verified; the run reads INCOMPLETE" \
  invar inspect records "$run"
step "7. Resume: the same command re-issues only the planned calls that have no answer, then closes the run" \
  invar use run "$contract" --run "$run"
head=$(invar inspect records "$run" --json | python3 -c 'import json, sys; print(json.load(sys.stdin)["chain_head"])')
step "8. A key pair for the contract owner, to sign what is decided" \
  invar keys new --out "$out/keys" --name owner
set +e
step "9. Decide: every record re-verified against the anchor, every score recomputed, a signed receipt kept" \
  invar use admit "$run" --contract "$contract" --expect-head "$head" --receipt "$out/receipt.json" \
  --key "$out/keys/owner.key"
answer=$?
set -e
case $answer in 0|10|11) ;; *) exit "$answer";; esac
step "10. Anyone holding the run, the contract, the receipt and the owner's public key can check the decision" \
  invar use verify "$out/receipt.json" --run "$run" --contract "$contract" --public-key "$out/keys/owner.pub"
printf '\nRecords of every step are in %s/ (use admit exit code %s: 0 Admitted, 10 Violated, 11 Unknown)\n' \
  "$out" "$answer"
