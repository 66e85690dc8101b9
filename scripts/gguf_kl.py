"""Invar's KL and same-top-token figures against llama.cpp's own `llama-perplexity --kl-divergence`, on the same
GGUF pair and the same tokens (docs/gguf.md, "Cross-check with llama.cpp's own tool").

    python scripts/gguf_kl.py [--ctx 128] [--chunks 16] [--rungs F16 Q8_0 Q4_K_M]

llama.cpp's side: `llama-perplexity` (built by scripts/llamacpp_tools.py build) runs the base, the ladder's F32 file,
over the text with `--kl-divergence-base FILE` (it saves the tokens and, for the second half of every window of
`--ctx` tokens, each position's log-probabilities in 16 bits), then each rung with `--kl-divergence`; its "Mean
KLD" and "Same top p" lines are read from its output. One thread and flash attention off, as the llamacpp worker.

Invar's side: the same tokens (llama.cpp's tokenizer of the text here, checked equal to the base file's) go to the
llamacpp worker's `score` (the protocol's teacher-forced scoring) for each window: the window's first half and one
more token as the prompt, the rest as the response, the whole vocabulary captured at every step, so each capture
is the distribution llama.cpp scored at that position. Each position's pair of captures goes through
`invar.compare.metrics.compare_capture` and the aggregates `compare numerical` reports (`distribution`,
`fraction_and_uncertainty`): KL(base ‖ rung) mean ± its error, and the same-top fraction. A third column computes
the same figures from each window evaluated in one batch, as llama-perplexity evaluates it (llama-cpp-python's
`Llama` with every position's logits), to tell the computation path apart from llama.cpp's 16-bit storage of the
base. The text is the repository's LICENSE (the Apache License 2.0; its sha256 is recorded). Invar's captures are
kept under runs/gguf-kl/ and reused (`--invar-only` computes them alone, before the tool is built).
Writes docs/gguf/kl.json and prints the table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
LADDER = ROOT / "models" / "smollm2-ladder"
TOOLS = ROOT / "models" / "smollm2-cache" / "llama-tools"
TEXT = ROOT / "LICENSE"
OUT = ROOT / "docs" / "gguf" / "kl.json"
BASE = "F32"


def say(message: str) -> None:
    print(f"[gguf_kl] {message}", file=sys.stderr, flush=True)


def gguf(rung: str) -> Path:
    files = sorted((LADDER / rung).glob("*.gguf"))
    if len(files) != 1:
        raise SystemExit(f"gguf_kl: {LADDER / rung} holds {len(files)} .gguf files; run scripts/gguf_ladder.py build")
    return files[0]


def tool() -> Path:
    path = TOOLS / "build" / "bin" / "llama-perplexity"
    if not path.is_file():
        raise SystemExit(f"gguf_kl: {path} is not built; run scripts/llamacpp_tools.py build")
    return path


def run_tool(args: list[str]) -> str:
    # one thread and the plain attention path (flash attention off), as the llamacpp worker runs
    done = subprocess.run([str(tool()), "-t", "1", "-tb", "1", "-fa", "off", *args], capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise SystemExit(f"gguf_kl: llama-perplexity {' '.join(args)} exited {done.returncode}: "
                         f"{done.stderr[-2000:]}")
    return done.stdout + done.stderr


def read_base(path: Path) -> tuple[int, int, np.ndarray]:
    """The base file's window size, vocabulary size and tokens int32 [chunks, ctx] (`perplexity.cpp`'s layout:
    "_logits_", n_ctx, n_vocab, n_chunk, the tokens, then the 16-bit log-probabilities)."""
    with path.open("rb") as f:
        if f.read(8) != b"_logits_":
            raise SystemExit(f"gguf_kl: {path} is not a llama-perplexity base file")
        n_ctx, n_vocab, n_chunk = (int(x) for x in np.frombuffer(f.read(12), dtype=np.int32))
        tokens = np.frombuffer(f.read(4 * n_ctx * n_chunk), dtype=np.int32).reshape(n_chunk, n_ctx)
    return n_ctx, n_vocab, tokens


def llama_figures(out: str) -> dict[str, Any]:
    """llama-perplexity's KL-divergence summary lines, as printed."""
    def grab(label: str) -> tuple[float, float]:
        m = re.search(rf"^{re.escape(label)}:\s*(-?[\d.e+-]+)\s*±\s*([\d.e+-]+)", out, re.MULTILINE)
        if m is None:
            raise SystemExit(f"gguf_kl: no {label!r} line in llama-perplexity's output:\n{out[-3000:]}")
        return float(m.group(1)), float(m.group(2))

    kld, kld_err = grab("Mean    KLD")
    top, top_err = grab("Same top p")
    return {"mean_kld": kld, "mean_kld_stderr": kld_err, "same_top_percent": top, "same_top_stderr": top_err}


def invar_captures(rung: str, tokens: np.ndarray, add_bos: int | None) -> list[np.ndarray]:
    """Per window, float32 [ctx - 1 - ctx/2, V]: the llamacpp worker's whole-vocabulary captures at every scored
    position, teacher-forced on the window's tokens."""
    from invar import canonical
    from invar.engines import start_worker

    folder = LADDER / rung
    n_ctx = tokens.shape[1]
    first = n_ctx // 2
    client = start_worker("llamacpp", args=["--threads", "1", "--context", str(n_ctx)])
    try:
        client.call("load_model", {"model_dir": str(folder), "model_digest": canonical.tree_digest(folder),
                                   "dtype": "float32", "quantization": "none", "adapter": None})
        out = []
        for c, window in enumerate(tokens):
            ids = [int(t) for t in window]
            if add_bos is not None:
                ids[0] = add_bos  # llama-perplexity puts BOS first in every window of a model that adds one
            response = np.asarray(ids[first + 1:], dtype=np.int32)
            item = {"item_id": f"window-{c}", "prompt_ids": ids[: first + 1], "response_tokens": response,
                    "temperature": 1.0, "vocab_steps": list(range(response.size))}
            (scored,) = client.call("score", {"items": [item]})["outputs"]
            out.append(np.asarray(scored["vocab_logprobs"], dtype=np.float32))
        return out
    finally:
        client.close()


def batch_captures(rung: str, tokens: np.ndarray, add_bos: int | None, work: Path) -> list[np.ndarray]:
    """Per window, float32 [ctx - 1 - ctx/2, V]: the same positions evaluated as llama-perplexity evaluates them,
    the whole window in one llama_decode (llama-cpp-python's `Llama`, every position's logits kept), then
    log_softmax in float64, rounded to float32. It separates the computation path from llama.cpp's 16-bit storage
    of the base. Kept under runs/gguf-kl/ as `cached_captures` keeps the worker's."""
    import hashlib

    import llama_cpp as lc

    n_ctx = tokens.shape[1]
    first = n_ctx // 2
    key = hashlib.sha256(tokens.tobytes()).hexdigest()[:16]
    path = work / f"batch-{rung}-{n_ctx}-{key}.npy"
    if path.is_file():
        return list(np.load(path))
    llm = lc.Llama(model_path=str(gguf(rung)), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_threads=1,
                   n_threads_batch=1, logits_all=True, flash_attn=False, verbose=False)
    out = []
    for window in tokens:
        ids = [int(t) for t in window]
        if add_bos is not None:
            ids[0] = add_bos
        llm.n_tokens = 0  # `Llama.reset`: eval clears the cache from here
        llm.eval(ids)
        logits = np.asarray(llm.scores[first:n_ctx - 1], dtype=np.float64)
        top = logits.max(axis=1, keepdims=True)
        lse = top + np.log(np.exp(logits - top).sum(axis=1, keepdims=True))
        out.append((logits - lse).astype(np.float32))
    llm.close()
    np.save(path, np.stack(out))
    return out


def invar_figures(base: list[np.ndarray], rung: list[np.ndarray], tokens: np.ndarray) -> dict[str, Any]:
    from invar.compare.metrics import compare_capture, distribution, fraction_and_uncertainty

    first = tokens.shape[1] // 2
    caps = [compare_capture(s, b[s], r[s], int(window[first + 1 + s]))
            for b, r, window in zip(base, rung, tokens, strict=True) for s in range(b.shape[0])]
    kl = distribution([c.kl_ref_cand for c in caps])
    assert kl is not None
    top, top_err = fraction_and_uncertainty(sum(c.same_top for c in caps), len(caps))
    return {"positions": len(caps), "mean_kld": kl.mean, "mean_kld_stderr": kl.stderr,
            "same_top_percent": 100 * top, "same_top_stderr": 100 * top_err,
            "mean_kl_error_bound": float(np.mean([c.bound_ref_cand for c in caps])),
            "identical_captures": sum(c.identical for c in caps)}


def tokenize_text(rung: str, n_ctx: int, chunks: int) -> np.ndarray:
    """The text's tokens as llama-perplexity takes them (llama.cpp's tokenizer of the GGUF, special tokens added,
    none parsed), int32 [chunks, n_ctx]; `main` checks them against the base file's."""
    import llama_cpp as lc

    with gguf_vocab(rung) as vocab:
        text = TEXT.read_bytes()
        buf = (lc.llama_token * (len(text) + 16))()
        n = lc.llama_tokenize(vocab, text, len(text), buf, len(buf), True, False)
        if n < 0:
            raise SystemExit(f"gguf_kl: llama.cpp could not tokenize {TEXT}")
    ids = np.asarray(buf[:n], dtype=np.int32)
    chunks = min(chunks, ids.size // n_ctx)
    if chunks < 2:
        raise SystemExit(f"gguf_kl: {TEXT} gives {ids.size} tokens, fewer than 2 windows of {n_ctx}")
    return ids[: chunks * n_ctx].reshape(chunks, n_ctx)


def cached_captures(rung: str, tokens: np.ndarray, add_bos: int | None, work: Path) -> list[np.ndarray]:
    """`invar_captures`, kept under runs/gguf-kl/ by rung and tokens (a rerun of the script reuses them)."""
    import hashlib

    key = hashlib.sha256(tokens.tobytes()).hexdigest()[:16]
    path = work / f"captures-{rung}-{tokens.shape[1]}-{key}.npy"
    if path.is_file():
        return list(np.load(path))
    started = time.perf_counter()
    caps = invar_captures(rung, tokens, add_bos)
    np.save(path, np.stack(caps))
    say(f"invar score {rung}: {time.perf_counter() - started:.0f} s")
    return caps


def bos_of(rung: str) -> int | None:
    """The BOS id llama.cpp puts first in each window, or None for a model that adds none (SmolLM2's)."""
    import llama_cpp as lc

    with gguf_vocab(rung) as vocab:
        return int(lc.llama_vocab_bos(vocab)) if lc.llama_vocab_get_add_bos(vocab) else None


@contextlib.contextmanager
def gguf_vocab(rung: str) -> Iterator[Any]:
    """The vocabulary of the rung's GGUF file, loaded without its weights through llama.cpp's own API."""
    import llama_cpp as lc

    lc.llama_backend_init()
    params = lc.llama_model_default_params()
    params.vocab_only = True
    model = lc.llama_model_load_from_file(str(gguf(rung)).encode(), params)
    try:
        yield lc.llama_model_get_vocab(model)
    finally:
        lc.llama_model_free(model)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gguf_kl.py")
    parser.add_argument("--ctx", type=int, default=128, help="llama-perplexity's window (--ctx-size)")
    parser.add_argument("--chunks", type=int, default=16, help="windows of the text to use (--chunks)")
    parser.add_argument("--rungs", nargs="+", default=["F16", "Q8_0", "Q4_K_M"])
    parser.add_argument("--invar-only", action="store_true", help="only compute (and keep) Invar's captures")
    args = parser.parse_args(argv)
    if args.ctx < 4 or args.ctx % 2 or args.chunks < 2:
        print("gguf_kl: --ctx must be an even number ≥ 4 and --chunks ≥ 2", file=sys.stderr)
        return 2
    from invar.canonical import file_sha256

    work = ROOT / "runs" / "gguf-kl"
    work.mkdir(parents=True, exist_ok=True)
    base_file = work / f"base-{BASE}-c{args.ctx}.bin"
    common = ["-c", str(args.ctx), "-b", str(args.ctx), "--chunks", str(args.chunks)]
    tokens = tokenize_text(BASE, args.ctx, args.chunks)
    add_bos = bos_of(BASE)
    caps = {rung: cached_captures(rung, tokens, add_bos, work) for rung in [BASE, *args.rungs]}
    batch = {rung: batch_captures(rung, tokens, add_bos, work) for rung in [BASE, *args.rungs]}
    if args.invar_only:
        return 0  # the captures are kept; llama-perplexity can come later
    started = time.perf_counter()
    base_out = run_tool(["-m", str(gguf(BASE)), "-f", str(TEXT), "--kl-divergence-base", str(base_file), *common])
    say(f"llama-perplexity base {BASE}: {time.perf_counter() - started:.0f} s")
    n_ctx, _, theirs = read_base(base_file)
    if n_ctx != args.ctx or not np.array_equal(theirs, tokens):
        raise SystemExit(f"gguf_kl: {base_file} holds other tokens than llama.cpp's tokenizer gave here")
    rows = []
    for rung in args.rungs:
        started = time.perf_counter()
        out = run_tool(["-m", str(gguf(rung)), "--kl-divergence-base", str(base_file), "--kl-divergence", *common])
        say(f"llama-perplexity {rung}: {time.perf_counter() - started:.0f} s")
        rows.append({"rung": rung, "llama_perplexity": llama_figures(out),
                     "invar": invar_figures(caps[BASE], caps[rung], tokens),
                     "invar_window_in_one_batch": invar_figures(batch[BASE], batch[rung], tokens)})
    result = {"base": BASE, "text": str(TEXT.relative_to(ROOT)), "text_sha256": file_sha256(TEXT), "ctx": args.ctx,
              "chunks": int(tokens.shape[0]), "positions_per_chunk": args.ctx - 1 - args.ctx // 2,
              "add_bos": add_bos is not None, "base_perplexity_output_tail": base_out.strip().splitlines()[-1],
              "rows": rows}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(f"| rung vs {BASE} | figure | llama-perplexity --kl-divergence | Invar (worker's score) | Invar (window in "
          "one batch) |")
    print("|---|---|---|---|---|")
    for r in rows:
        cols = (r["llama_perplexity"], r["invar"], r["invar_window_in_one_batch"])
        print(f"| {r['rung']} | mean KL, nats | "
              + " | ".join(f"{c['mean_kld']:.6f} ± {c['mean_kld_stderr']:.6f}" for c in cols) + " |")
        print(f"| {r['rung']} | same top, % | "
              + " | ".join(f"{c['same_top_percent']:.3f} ± {c['same_top_stderr']:.3f}" for c in cols) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
