"""Train the project's tiny arithmetic model, deterministically on the CPU, and write its model folder.

    python scripts/train_model.py                      # train, evaluate, write models/tiny-arith
    python scripts/train_model.py --check              # retrain in a scratch folder, compare the weights digest
    python scripts/train_model.py --steps 20 --out /tmp/x --no-eval   # a short run (reproducibility checks)

The model is a Qwen3-architecture causal LM with a character-level tokenizer, saved so that transformers, vLLM
and mlx-lm all load the same folder. Training reads the `train` split of the arithmetic task
(`invar.tasks.arithmetic.stream("train", seed=3)`), which is disjoint from the evaluation population by
construction, and puts the loss on the answer characters and the end-of-sequence token only. It stops at a fixed
step count chosen so the model is good but not perfect: sampling at temperature 1 still gets a clear fraction of
problems wrong, so numerical changes in an engine can flip answers.

Bitwise reproducibility: fixed seeds, `torch.use_deterministic_algorithms(True)`, a fixed thread count, and a data
order that is a pure function of the step. The same torch build and CPU kind reproduce the same weights digest.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import tempfile
import time
from collections import Counter
from itertools import islice
from pathlib import Path
from typing import Any

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from invar.tasks import ModelTokenizer
from invar.tasks.arithmetic import KINDS, MAX_ANSWER_CHARS, Problem, load_population, score, stream

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "models" / "tiny-arith"
EVAL_FILE = ROOT / "data" / "arith-eval.jsonl"
MONITOR_FILE = ROOT / "data" / "arith-train.jsonl"

# `<unk>` is never produced from task text, but mlx-lm probes the tokenizer with text outside the vocabulary.
SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")
PAD, BOS, EOS = 0, 1, 2
CHARS = "0123456789+-*="
MAX_LEN = 128
TRAIN_STREAM_SEED = 3
SAMPLE_SEED = 1234
CARD_SAMPLE_STRIDE = 100  # the fixed 200-problem sample: every 100th problem of the evaluation population


def model_config() -> Qwen3Config:
    """The architecture: head_dim 32 because vLLM's CPU attention rejects 16."""
    return Qwen3Config(
        vocab_size=len(SPECIALS) + len(CHARS),
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=MAX_LEN,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        pad_token_id=PAD,
        bos_token_id=BOS,
        eos_token_id=EOS,
        dtype="float32",
    )


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A WordLevel tokenizer over single characters; prompts get BOS in front, as every engine encodes them."""
    vocab = {token: i for i, token in enumerate((*SPECIALS, *CHARS))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.add_special_tokens(list(SPECIALS))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", BOS)])
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        model_max_length=MAX_LEN,
    )


def char_ids() -> dict[str, int]:
    return {c: i + len(SPECIALS) for i, c in enumerate(CHARS)}


def text_of(ids: list[int]) -> str:
    """Response text before the first EOS, special tokens rendered by name (so they never score as digits)."""
    table = (*SPECIALS, *CHARS)
    return "".join(table[t] for t in (ids[: ids.index(EOS)] if EOS in ids else ids))


def batch_tensors(problems: list[Problem]) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids [B, L] (BOS prompt answer EOS, right padded) and targets [B, L] (-100 except answer + EOS)."""
    ids = char_ids()
    rows = [([BOS] + [ids[c] for c in p.prompt], [ids[c] for c in p.answer] + [EOS]) for p in problems]
    length = max(len(a) + len(b) for a, b in rows)
    tokens = torch.full((len(rows), length), PAD, dtype=torch.long)
    targets = torch.full((len(rows), length), -100, dtype=torch.long)
    for r, (prompt, answer) in enumerate(rows):
        seq = prompt + answer
        tokens[r, : len(seq)] = torch.tensor(seq)
        # Position t predicts token t+1: the answer tokens are predicted from the position before each.
        targets[r, len(prompt) - 1 : len(seq) - 1] = torch.tensor(answer)
    return tokens, targets


def learning_rate(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def complete(model: Qwen3ForCausalLM, prompts: list[str], temperature: float, seed: int) -> list[list[int]]:
    """Response token ids per prompt: greedy when temperature is 0, else sampled at `temperature`.

    Prompts of equal length run as one batch (no padding), recomputing the whole sequence each step.
    """
    ids = char_ids()
    generator = torch.Generator().manual_seed(seed)
    out: dict[int, list[int]] = {}
    by_length: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        by_length.setdefault(len(p), []).append(i)
    for length in sorted(by_length):
        for start in range(0, len(by_length[length]), 512):
            idx = by_length[length][start : start + 512]
            seq = torch.tensor([[BOS] + [ids[c] for c in prompts[i]] for i in idx])
            done = torch.zeros(len(idx), dtype=torch.bool)
            gen: list[torch.Tensor] = []
            for _ in range(MAX_ANSWER_CHARS + 2):
                logits = model(seq).logits[:, -1, :].float()
                if temperature == 0:
                    nxt = logits.argmax(-1)
                else:
                    nxt = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=generator)[:, 0]
                gen.append(nxt)
                done |= nxt == EOS
                seq = torch.cat([seq, nxt[:, None]], 1)
                if bool(done.all()):
                    break
            stacked = torch.stack(gen, 1).tolist()
            for row, i in enumerate(idx):
                out[i] = stacked[row]
    return [out[i] for i in range(len(prompts))]


def accuracy(vocab: ModelTokenizer, problems: list[Problem], responses: list[list[int]]) -> tuple[int, dict[str, int]]:
    """Number correct, and number correct per kind, scored by the core's scorer on the core's decoding."""
    correct: Counter[str] = Counter()
    for p, r in zip(problems, responses, strict=True):
        correct[p.kind] += 1 - score(p.prompt, vocab.decode(r))
    return sum(correct.values()), dict(correct)


@torch.no_grad()
def generate_one_by_one(
    model: Qwen3ForCausalLM, tokenizer: PreTrainedTokenizerFast, prompts: list[str]
) -> list[list[int]]:
    """Greedy response ids through transformers' own `generate`, one prompt at a time (as the shipped-model test)."""
    responses = []
    for prompt in prompts:
        enc = tokenizer(prompt, return_tensors="pt")
        out = model.generate(**enc, do_sample=False, max_new_tokens=MAX_ANSWER_CHARS + 2)  # type: ignore[misc]
        responses.append(out[0, enc.input_ids.shape[1] :].tolist())
    return responses


def file_digests(folder: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.iterdir())
        if p.is_file() and p.name != "SHA256SUMS"
    }


def train(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(args.threads)
    model = Qwen3ForCausalLM(model_config())  # type: ignore[no-untyped-call]
    model.train()
    params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    problems = stream("train", seed=TRAIN_STREAM_SEED)
    monitor = load_population(MONITOR_FILE, MONITOR_FILE.with_suffix(".sha256").read_text().split()[0])[:1000]
    tokenizer = build_tokenizer()
    started = time.perf_counter()
    for step in range(args.steps):
        tokens, targets = batch_tensors(list(islice(problems, args.batch)))
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, args.steps, args.lr, args.warmup)
        logits = model(tokens).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if args.log_every and (step + 1) % args.log_every == 0:
            model.eval()  # type: ignore[no-untyped-call]
            responses = complete(model, [p.prompt for p in monitor], 0.0, 0)
            hits = sum(1 - score(p.prompt, text_of(r)) for p, r in zip(monitor, responses, strict=True))
            model.train()
            print(f"step {step + 1}: loss {loss.item():.4f}, greedy on 1000 monitor problems {hits / 10:.1f} %, "
                  f"{time.perf_counter() - started:.0f} s", flush=True)
    seconds = time.perf_counter() - started
    model.eval()  # type: ignore[no-untyped-call]
    model.generation_config = GenerationConfig(bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD)  # type: ignore[no-untyped-call]
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    # Name the class every transformers version knows (5.x writes its new backend name, which 4.x lacks).
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    info = {"params": params, "seconds": round(seconds, 1), "final_loss": round(loss.item(), 4),
            "args": {k: v for k, v in vars(args).items() if k not in ("out", "check", "no_eval", "card_only")}}
    (out / "training.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return info


def write_card(out: Path) -> None:
    """Evaluate the saved folder and write MODEL_CARD.md and SHA256SUMS (training facts from training.json)."""
    info = json.loads((out / "training.json").read_text())
    args = argparse.Namespace(**info["args"])
    torch.set_num_threads(1)  # as the shipped-model test runs it
    model = Qwen3ForCausalLM.from_pretrained(out)
    model.eval()  # type: ignore[no-untyped-call]
    tokenizer = PreTrainedTokenizerFast.from_pretrained(out)
    vocab = ModelTokenizer.from_model_dir(out)
    digest = (ROOT / "data" / "arith-eval.sha256").read_text().split()[0]
    problems = load_population(EVAL_FILE, digest)
    prompts = [p.prompt for p in problems]
    greedy, greedy_kinds = accuracy(vocab, problems, complete(model, prompts, 0.0, 0))
    sampled, sampled_kinds = accuracy(vocab, problems, complete(model, prompts, 1.0, SAMPLE_SEED))
    sample = problems[::CARD_SAMPLE_STRIDE]
    card_count, _ = accuracy(vocab, sample, generate_one_by_one(model, tokenizer, [p.prompt for p in sample]))
    kinds = Counter(p.kind for p in problems)
    n = len(problems)
    weights = (out / "model.safetensors").read_bytes()
    cfg = model_config()
    rows = "\n".join(
        f"| {k} | {kinds[k]:,} | {100 * greedy_kinds.get(k, 0) / kinds[k]:.1f} % | "
        f"{100 * sampled_kinds.get(k, 0) / kinds[k]:.1f} % |"
        for k in KINDS
    )
    command = (
        f"python scripts/train_model.py --steps {args.steps} --batch {args.batch} --lr {args.lr} "
        f"--warmup {args.warmup} --seed {args.seed} --threads {args.threads}"
    )
    card = f"""# tiny-arith

A {info["params"]:,}-parameter Qwen3-architecture causal LM with a character-level tokenizer, trained from scratch on
Invar's arithmetic task (`invar.tasks.arithmetic`), so that Invar's checks run end to end on a real model that
transformers, vLLM and mlx-lm all load from this folder. Written by `scripts/train_model.py`; see `docs/model.md`.

## Config
- `Qwen3ForCausalLM`: hidden {cfg.hidden_size}, intermediate {cfg.intermediate_size}, \
{cfg.num_hidden_layers} layers, {cfg.num_attention_heads} attention heads, {cfg.num_key_value_heads} KV heads, \
head_dim {cfg.head_dim}, tied embeddings, float32,
  max_position_embeddings {cfg.max_position_embeddings}, rms_norm_eps {cfg.rms_norm_eps}.
- Vocabulary of {cfg.vocab_size}: `<pad>`=0, `<s>`=1 (BOS), `</s>`=2 (EOS), `<unk>`=3, then the characters
  `{CHARS}` as ids 4..{cfg.vocab_size - 1}; a WordLevel tokenizer over single characters (`tokenizer.json`).

## Prompt and response format (what the scorer `arithmetic-exact` expects)
- Prompt: the problem text, e.g. `37+58=`; the tokenizer puts BOS in front, as every engine encodes it.
- Response: the answer's canonical decimal digits (an optional `-`, no leading zeros, no spaces), then EOS.
- The core decodes the response token ids itself and cuts at the first EOS; the text scores loss 0 exactly when
  it equals the answer computed from the prompt, else 1 (a special token inside the text is a wrong answer).
- Answers have at most {MAX_ANSWER_CHARS} characters: allow at least {MAX_ANSWER_CHARS + 1} response tokens so EOS fits.

## Training
- Command (from the repository root; `--check` retrains in a scratch folder and compares the weights digest):

      {command}

- Data: the `train` split stream of seed {TRAIN_STREAM_SEED}, {args.steps:,} steps of {args.batch} problems \
({args.steps * args.batch:,} in all); loss on the answer characters and EOS only.
- AdamW (betas 0.9, 0.98, weight decay 0.01), peak lr {args.lr}, {args.warmup} warmup steps then cosine to 10 %,
  gradient clip 1.0; torch seed {args.seed}, deterministic algorithms, {args.threads} thread(s).
- Training time: {info["seconds"]:.0f} s on a shared 2-core x86-64 CPU; final batch loss {info["final_loss"]:.4f}.
- Weights digest (sha256 of model.safetensors): `{hashlib.sha256(weights).hexdigest()}`

## Evaluation on `data/arith-eval.jsonl` (sha256 `{digest}`)
- Greedy accuracy, all {n:,} problems: {greedy:,}/{n:,} = {100 * greedy / n:.2f} %.
- Sampled accuracy at temperature 1, one sample each (torch generator seed {SAMPLE_SEED}), all {n:,} problems:
  {sampled:,}/{n:,} = {100 * sampled / n:.2f} %.
- Greedy with transformers `generate`, one prompt at a time, on the fixed 200-problem sample (every
  {CARD_SAMPLE_STRIDE}th problem: eval-000000, eval-000100, ...): {card_count}/{len(sample)}

The full-population figures come from a batched loop (prompts of equal length together, the whole sequence
recomputed each step); `tests/model/test_shipped_model.py` reproduces the 200-problem count exactly.

| kind | problems | greedy | sampled at T=1 |
|---|---|---|---|
{rows}
"""
    (out / "MODEL_CARD.md").write_text(card)
    sums = "".join(f"{h}  {name}\n" for name, h in file_digests(out).items())
    (out / "SHA256SUMS").write_text(sums)
    print(card)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--log-every", type=int, default=250)
    parser.add_argument("--no-eval", action="store_true", help="save the weights only; no evaluation, no card")
    parser.add_argument("--check", action="store_true", help="retrain in a scratch folder; compare with --out")
    parser.add_argument("--card-only", action="store_true", help="re-evaluate --out and rewrite its card")
    args = parser.parse_args()
    if args.card_only:
        write_card(args.out)
        return 0
    if args.check:
        with tempfile.TemporaryDirectory() as scratch:
            info = train(args, Path(scratch))
            fresh = hashlib.sha256((Path(scratch) / "model.safetensors").read_bytes()).hexdigest()
        shipped = hashlib.sha256((args.out / "model.safetensors").read_bytes()).hexdigest()
        print(f"retrained in {info['seconds']:.0f} s: {fresh}\nshipped: {shipped}")
        print("same weights" if fresh == shipped else "DIFFERENT weights")
        return 0 if fresh == shipped else 1
    info = train(args, args.out)
    digest = hashlib.sha256((args.out / "model.safetensors").read_bytes()).hexdigest()
    print(f"trained {info['params']:,} parameters in {info['seconds']:.0f} s; weights sha256 {digest}")
    if not args.no_eval:
        write_card(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
