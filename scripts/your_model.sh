#!/usr/bin/env bash
# The worked example of docs/your-model.md: your own model folder, your own population and your own scorer, from
# a first inference call to a decision. A random-weight Llama with a BPE tokenizer and a chat template stands in
# for your model (scripts/example_model.py); examples/your-model/ holds the population and the scorer.
# Usage: bash scripts/your_model.sh [OUT_DIR]   (default runs/your-model-<time>; needs the installed venv on PATH)
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
out="${1:-runs/your-model-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$out"
step() { printf '\n\033[1m== %s\033[0m\n$ %s\n' "$1" "${*:2}"; "${@:2}"; }

step "1. Your model folder (here a random Llama with a BPE tokenizer and a ChatML template)" \
  python scripts/example_model.py "$out/model"
cp examples/your-model/population.jsonl examples/your-model/population.sha256 examples/your-model/scorer.py "$out/"
step "2. One inference call: the core tokenizes the prompt with the model's own tokenizer" \
  invar infer "What is 2 + 3?" --model "$out/model" --temperature 0 --max-tokens 8 --run "$out/infer"
step "3. Evaluate on your population (chat units go through the model's template) with your scorer" \
  invar evaluate --model "$out/model" --population "$out/population.jsonl" --scorer "$out/scorer.py:loss" \
  --scorer-setting 'loss_range=[0, 1]' --scorer-setting binary=true --max-tokens 8 --temperature 0 \
  --count 16 --run "$out/evaluate"
step "4. What a package on this engine must state, model and tokenizer digests included" \
  invar use package hf --model "$out/model"
invar use package hf --model "$out/model" --json > "$out/package.json"
# The declaration: may bfloat16 weights replace float32 for this use? Written from the package the engine stated.
python - "$out" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
pkg = json.loads((out / "package.json").read_text())
sha = (out / "population.sha256").read_text().split()[0]
def table(d):
    return "{ " + ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in sorted(d.items())) + " }"
package = f"""engine = "hf"
engine_version = {table(pkg["engine_version"])}
settings = {table(pkg["settings"])}
model_dir = "model"
model_digest = "{pkg["model_digest"]}"
"""
(out / "declaration.toml").write_text(f"""name = "your-model-bf16"
description = "May bfloat16 weights replace float32 for adding small numbers, on 48 prompts?"
[population]
path = "population.jsonl"
sha256 = "{sha}"
[scorer]
name = "scorer.py:loss"
settings = {{ loss_range = [0, 1], binary = true }}
[sampling]
temperature = 1.0
max_tokens = 8
[requirement]
standard = "population"
epsilon = "0.1"
confidence = "0.95"
method = "paired-binary-exact"
[pairing]
seed = 7
layout = "b16"
[layouts.b16]
batch_size = 16
[invariance]
required = false
[reference]
{package}dtype = "float32"
[candidate]
{package}dtype = "bfloat16"
[[premises]]
statement = "The population represents the prompts the model will be asked in this use."
party = "the example's owner"
basis_sha256 = "{sha}"
reliance = "vouched"
""")
PY
step "5. The declaration becomes a contract; your scorer's file is pinned by its sha256" \
  invar use prepare "$out/declaration.toml"
contract="$out/your-model-bf16.contract.json"
step "6. How many prompts each bound needs, if 1% of prompts get worse and 1% better" \
  invar use plan "$contract" --assume "worse=0.01 better=0.01" --method paired-binary-exact
step "7. Run the plan: both packages on the same prompt ids and seeds; every call and report kept" \
  invar use run "$contract" --run "$out/use-run"
invar keys new --out "$out/keys" --name owner > /dev/null
set +e
step "8. Decide from the records alone, and sign a receipt of the decision" \
  invar use admit "$out/use-run" --contract "$contract" --receipt "$out/receipt.json" --key "$out/keys/owner.key"
answer=$?
set -e
case $answer in 0|10|11) ;; *) exit "$answer";; esac
step "9. Anyone holding the run, the contract, the receipt and the owner's public key can check the decision" \
  invar use verify "$out/receipt.json" --run "$out/use-run" --contract "$contract" --public-key "$out/keys/owner.pub"
printf '\nRecords are in %s/ (use admit exit code %s: 0 Admitted, 10 Violated, 11 Unknown)\n' "$out" "$answer"
