"""The llama.cpp worker: a GGUF file run by llama.cpp, in this process, through llama-cpp-python (inference only).

    python -m invar.workers.llamacpp_worker --role inference [--threads N] [--parallel N] [--context N]

Decisions this worker embodies:

- **A GGUF model is a folder**: exactly one `*.gguf` file beside the tokenizer files the core reads
  (`tokenizer.json`, `tokenizer_config.json`, and `generation_config.json` or `config.json` for the ids that end a
  response). The folder's tree digest is the model digest, so the GGUF's bytes, its quantization among them, are
  bound by it like any model's weights. The core tokenizes with the folder's tokenizer and llama.cpp runs the
  GGUF's own vocabulary: `load_model` checks that the two are one (the same text for every id, and the same ids
  for a probe text with special tokens, digits, accents and CJK) and refuses a mismatch in one line, naming the
  first id or text that differs.
- **Inference only**, on llama.cpp's C API (`llama_cpp`'s ctypes bindings) rather than the `Llama` class: the class
  holds one sequence and samples inside llama.cpp, while the protocol needs several sequences in one batch, a seed
  per request and the whole distribution at every step. llama.cpp computes the logits; the worker draws from them.
- **Batches are llama.cpp's own**: one context with `--parallel` sequences, each with its own KV cache of
  `--context` positions (no unified cache, so no sequence attends over another's slots). A declared batch prefills
  each prompt with its own `llama_decode` (prefilled together, llama.cpp splits prompts of unequal length into
  equal parts, and a prompt's tail in a part of its own rounds otherwise), then runs one `llama_decode` per step
  holding one token of each sequence still running. The cache is cleared before each batch, so a
  request's numbers never depend on what ran before it. Whether a request alone and inside a batch give the same
  bits is measured (tests/workers/llamacpp), not assumed.
- **Sampling** is the worker's, from llama.cpp's float32 logits: log_softmax(logits / T) in float64, rounded once to
  float32, is each step's distribution; the drawn token's value is its log-probability (before top-p truncation).
  T = 0 is greedy (first maximum) with log-probabilities at T = 1. Each request draws one uniform per step from its
  own `numpy` PCG64 generator seeded by the request's seed, used for nothing else, so what shares its batch cannot
  change which uniforms it consumes.
- **`score` is the generate path with the tokens given**: the same prefill, the same one-token steps in the same
  batch composition, the same float64 log_softmax. So the score of a sampled response, items batched as the
  requests were, is bit for bit the log-probabilities `generate` reported. The whole vocabulary at `vocab_steps` is
  that step's distribution at the item's temperature.
- **Identity**: llama-cpp-python's version, a sha256 of the llama.cpp libraries it loaded (the build), and
  llama.cpp's own line of CPU features and backends (`llama_print_system_info`: AVX2, BLAS, ...) in
  `engine_version`; threads, sequences, context, batch sizes, the KV cache type and the attention path in
  `settings`. The loaded GGUF's file type (Q4_1, Q8_0, ...) is bound by the model digest and printed on stderr at
  load.
- **No adapters**: a call naming one is refused (llama.cpp's LoRA takes GGUF adapters, not the PEFT folders the
  learners publish).
- Bad input (a folder without exactly one GGUF, a file llama.cpp cannot read, a tokenizer that is not the GGUF's,
  prompt ids outside the vocabulary, a batch or request past the context) is a `MethodError` raised before any
  state changes, so the worker keeps serving.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from invar import __version__
from invar.protocol import MethodError, Role, Server, exit_worker
from invar.protocol.methods import GENERATE, LOAD_MODEL, SCORE, serves
from invar.protocol.payloads import (
    FinishReason,
    GenerateOutput,
    GenerateParams,
    GenerateResult,
    LoadModelParams,
    LoadModelResult,
    ScoreOutput,
    ScoreParams,
    ScoreResult,
)
from invar.workers.common import check_prompt_ids, check_tokens, response_end_ids, verify_dir, versions

PROBE_TEXT = ("<|im_start|>user\nWhat is 12 + 7, and 3.5 × 40?<|im_end|>\n<|im_start|>assistant\n"
              "Naïve café: 東京 — 19, then 140!  \tDone.\n")
"""Text both tokenizers must split into the same ids (`load_model`'s check); special tokens a vocabulary lacks are
plain text to both."""

FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
              12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
              32: "BF16"}
"""llama.cpp's `general.file_type` values (`LLAMA_FTYPE_*`) by name, for the load line on stderr."""
KV_CACHE_TYPE = "f16"
"""llama.cpp's default KV cache type, kept (`type_k`, `type_v`)."""
FLASH_ATTENTION = 0
"""`LLAMA_FLASH_ATTN_TYPE_DISABLED`: the plain attention path, not llama.cpp's automatic choice."""
GGML_LOG_LEVEL_ERROR = 4


def llama() -> Any:
    """The bindings, imported where the worker needs them (the module is read by the core's tests without them)."""
    import llama_cpp

    return llama_cpp


def build_digest() -> str:
    """sha256 over the names and bytes of the llama.cpp libraries llama-cpp-python loads: the build that computes."""
    lib = Path(llama().__file__).parent / "lib"
    h = hashlib.sha256()
    for path in sorted(p for p in lib.iterdir() if p.is_file()):
        h.update(f"{path.name}:{path.stat().st_size}:".encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def system_info() -> str:
    """llama.cpp's line of CPU features and backends it was built with and found (AVX2, BLAS, OpenMP, ...)."""
    return " ".join(llama().llama_print_system_info().decode("utf-8", "replace").split())


@dataclass(frozen=True)
class Settings:
    """The launch settings: they shape the engine's numbers, so all of them are in the worker's identity."""

    threads: int
    parallel: int
    context: int

    def identity(self) -> dict[str, Any]:
        return {"device": "cpu", "threads": self.threads, "parallel": self.parallel, "context": self.context,
                "n_batch": max(self.context, self.parallel), "n_ubatch": max(self.context, self.parallel),
                "prefill": "each prompt in its own llama_decode", "decode": "one llama_decode per step, one token "
                "of every running sequence",
                "kv_unified": False, "kv_cache_type": KV_CACHE_TYPE, "flash_attention": "disabled",
                "sampling": "by the worker from llama.cpp's float32 logits: log_softmax(logits / T) in float64, "
                            "rounded to float32; numpy PCG64 per request",
                "teacher_forcing": "the generate path: one prefill, then one token per sequence per step"}


@dataclass
class Loaded:
    model: Any
    ctx: Any
    batch: Any
    vocab_size: int
    eos_ids: frozenset[int]
    digest: str
    file_type: str


def log_softmax(logits: np.ndarray, temperature: float) -> np.ndarray:
    """log_softmax(logits / T) of float32 logits [..., V], computed in float64 and rounded once to float32."""
    z = logits.astype(np.float64) / temperature
    top = np.max(z, axis=-1, keepdims=True)
    out: np.ndarray = (z - (top + np.log(np.sum(np.exp(z - top), axis=-1, keepdims=True)))).astype(np.float32)
    return out


def draw(lp: np.ndarray, top_p: float, u: float) -> int:
    """The token whose cumulative probability (in id order, over the top-p nucleus) first passes u × the total."""
    probs = np.exp(lp.astype(np.float64))
    if top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        ordered = probs[order]
        keep = (np.cumsum(ordered) - ordered) < top_p
        nucleus = np.zeros_like(probs)
        nucleus[order[keep]] = ordered[keep]
        probs = nucleus
    cdf = np.cumsum(probs)
    return int(min(np.searchsorted(cdf, u * cdf[-1], side="right"), lp.size - 1))


@dataclass
class Running:
    """One request or item in a batch: its prompt, then the tokens drawn (or given) so far."""

    prompt: list[int]
    temperature: float
    top_p: float
    limit: int
    given: np.ndarray | None = None
    """`score`'s response tokens; None: `generate` draws."""
    rng: np.random.Generator | None = None
    steps: tuple[int, ...] = ()
    tokens: list[int] = field(default_factory=list)
    logprobs: list[np.float32] = field(default_factory=list)
    vocab: list[np.ndarray] = field(default_factory=list)
    """The distribution [V] at each of `steps`, in step order."""


class Engine:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.m: Loaded | None = None

    def loaded(self, where: str) -> Loaded:
        if self.m is None:
            raise MethodError(f"{where}: no model is loaded; call load_model first")
        return self.m

    # -- loading ----------------------------------------------------------------------------------------------

    def load_model(self, params: LoadModelParams) -> LoadModelResult:
        req = params.require(("float32",), ("none",))
        if req.adapter is not None:
            raise MethodError("load_model.adapter: the llama.cpp worker loads no adapters; send null")
        digest = verify_dir(req.model_dir, req.model_digest, "model")
        files = sorted(Path(req.model_dir).glob("*.gguf"))
        if len(files) != 1:
            raise MethodError(f"load_model: {req.model_dir!r} holds {len(files)} .gguf files; a GGUF model folder "
                              "holds exactly one, beside its tokenizer.json and tokenizer_config.json")
        eos_ids = response_end_ids(req.model_dir)
        check_vocabulary(files[0], req.model_dir, eos_ids)
        if self.m is None:
            self.m = self._start(files[0], digest, eos_ids)
        elif self.m.digest != digest:
            raise MethodError(f"load_model: this worker already serves model {self.m.digest[:16]}…; a llama.cpp "
                              "worker holds one model for its life: start a new worker for another model")
        return LoadModelResult(digest, None, self.m.vocab_size, min(eos_ids), self.settings.context)

    def _start(self, gguf: Path, digest: str, eos_ids: frozenset[int]) -> Loaded:
        lc = llama()
        s = self.settings
        model = load_gguf(gguf, vocab_only=False)
        cparams = lc.llama_context_default_params()
        cparams.n_ctx = s.parallel * s.context
        cparams.n_batch = cparams.n_ubatch = max(s.context, s.parallel)
        cparams.n_seq_max = s.parallel
        cparams.n_threads = cparams.n_threads_batch = s.threads
        cparams.kv_unified = False
        cparams.flash_attn_type = FLASH_ATTENTION
        ctx = lc.llama_init_from_model(model, cparams)
        if not ctx:
            lc.llama_model_free(model)
            raise MethodError(f"load_model: llama.cpp could not make a context of {s.parallel} × {s.context} "
                              "positions for this model; lower --parallel or --context")
        batch = lc.llama_batch_init(max(s.context, s.parallel), 0, 1)
        vocab_size = int(lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model)))
        buf = ctypes.create_string_buffer(64)
        n = lc.llama_model_meta_val_str(model, b"general.file_type", buf, len(buf))
        code = int(buf.value) if n > 0 and buf.value.isdigit() else None
        file_type = "unstated" if code is None else FILE_TYPES.get(code, f"file type {code}")
        print(f"invar.workers.llamacpp_worker: loaded {gguf.name} ({file_type}, {vocab_size} tokens)",
              file=sys.stderr, flush=True)
        return Loaded(model, ctx, batch, vocab_size, eos_ids, digest, file_type)

    # -- the decode loop --------------------------------------------------------------------------------------

    def _run(self, seqs: list[Running]) -> None:
        """Decode `seqs` as one llama.cpp batch: every prompt in one `llama_decode`, then one token per running
        sequence per step, each drawn (or, for `score`, given) from its logits at that step."""
        lc = llama()
        m = self.loaded("generate")
        lc.llama_memory_clear(lc.llama_get_memory(m.ctx), True)
        # Each prompt in its own llama_decode: prefilled together, a prompt's last tokens can land in a ubatch of
        # their own (llama.cpp splits sequences of unequal length into equal parts), whose one-row product rounds
        # otherwise than the whole prompt's (measured: 0.087 nats at the first step; docs/gguf.md).
        outputs: dict[int, np.ndarray] = {}
        for j, s in enumerate(seqs):
            outputs.update(self._decode(m, [(j, pos, t) for pos, t in enumerate(s.prompt)]))
        while outputs:
            step = []
            for j, row in outputs.items():
                s = seqs[j]
                at = len(s.tokens)
                t1 = s.temperature if s.temperature > 0 else 1.0
                lp = log_softmax(row, t1)
                if s.given is not None:
                    token = int(s.given[at])
                elif s.temperature == 0:
                    token = int(np.argmax(row))
                else:
                    assert s.rng is not None
                    token = draw(lp, s.top_p, float(s.rng.random()))
                s.tokens.append(token)
                s.logprobs.append(lp[token])
                if at in s.steps:
                    s.vocab.append(lp)
                ended = token in m.eos_ids if s.given is None else False
                if not ended and len(s.tokens) < s.limit:
                    step.append((j, len(s.prompt) + at, token))
            outputs = self._decode(m, step) if step else {}

    def _decode(self, m: Loaded, entries: list[tuple[int, int, int]]) -> dict[int, np.ndarray]:
        """One `llama_decode` of (sequence, position, token) entries; per sequence, the logits [V] (float32, copied)
        at its last entry."""
        lc = llama()
        b = m.batch
        last: dict[int, int] = {}
        for k, (j, pos, token) in enumerate(entries):
            b.token[k], b.pos[k], b.n_seq_id[k], b.logits[k] = token, pos, 1, 0
            b.seq_id[k][0] = j
            last[j] = k
        for k in last.values():
            b.logits[k] = 1
        b.n_tokens = len(entries)
        code = lc.llama_decode(m.ctx, b)
        if code != 0:
            raise RuntimeError(f"llama_decode returned {code}")
        return {j: np.ctypeslib.as_array(lc.llama_get_logits_ith(m.ctx, k), shape=(m.vocab_size,)).copy()
                for j, k in last.items()}

    def _check_fits(self, sizes: list[tuple[int, int]], batches: list[list[int]], where: str) -> None:
        """Each (prompt length, tokens to decode) must fit one sequence's context; each batch the sequences."""
        s = self.settings
        for i, (prompt, tokens) in enumerate(sizes):
            if prompt + tokens > s.context:
                raise MethodError(f"{where}[{i}]: {prompt} prompt tokens + {tokens} response tokens exceed the "
                                  f"worker's context of {s.context} positions per sequence; shorten the prompt, "
                                  "lower max_tokens or start the worker with a larger --context")
        for k, batch in enumerate(batches):
            if len(batch) > s.parallel:
                raise MethodError(f"{where.split('.')[0]}.layout[{k}]: {len(batch)} sequences in one batch, but this "
                                  f"worker's context holds {s.parallel} (--parallel); split the batch or raise it")

    # -- methods ----------------------------------------------------------------------------------------------

    def generate(self, call: GenerateParams) -> GenerateResult:
        m = self.loaded("generate")
        if call.adapter not in (None, "base") or call.reference_adapter is not None:
            raise MethodError("generate.adapter: the llama.cpp worker loads no adapters; send adapter and "
                              "reference_adapter null")
        for i, req in enumerate(call.requests):
            check_prompt_ids(list(req.prompt_ids), m.vocab_size, f"generate.requests[{i}]")
        self._check_fits([(len(r.prompt_ids), r.max_tokens) for r in call.requests], call.batches,
                         "generate.requests")
        outputs: list[GenerateOutput | None] = [None for _ in call.requests]
        for batch in call.batches:
            seqs = [Running(list(call.requests[i].prompt_ids), call.requests[i].temperature, call.requests[i].top_p,
                             call.requests[i].max_tokens, rng=np.random.Generator(np.random.PCG64(
                                 call.requests[i].seed))) for i in batch]
            self._run(seqs)
            for i, s in zip(batch, seqs, strict=True):
                tokens = np.asarray(s.tokens, dtype=np.int32)
                finish: FinishReason = "stop" if s.tokens[-1] in m.eos_ids else "length"
                outputs[i] = GenerateOutput(call.requests[i].request_id,
                                            np.asarray(call.requests[i].prompt_ids, dtype=np.int32), tokens,
                                            np.asarray(s.logprobs, dtype=np.float32), finish)
        return GenerateResult([o for o in outputs if o is not None], m.digest, None, packed=call.packed)

    def score(self, call: ScoreParams) -> ScoreResult:
        m = self.loaded("score")
        if call.adapter not in (None, "base"):
            raise MethodError("score.adapter: the llama.cpp worker loads no adapters; send null")
        for i, it in enumerate(call.items):
            check_prompt_ids(list(it.prompt_ids), m.vocab_size, f"score.items[{i}]")
            check_tokens(it.tokens, m.vocab_size, f"score.items[{i}].response_tokens")
        # All items form one batch, in order, in as many batches of --parallel as they need.
        n, p = len(call.items), self.settings.parallel
        batches = [list(range(a, min(n, a + p))) for a in range(0, n, p)]
        self._check_fits([(len(it.prompt_ids), it.tokens.size) for it in call.items], batches, "score.items")
        outputs = []
        for batch in batches:
            seqs = [Running(list(call.items[i].prompt_ids), call.items[i].temperature, 1.0,
                             call.items[i].tokens.size, given=call.items[i].tokens,
                             steps=tuple(call.items[i].vocab_steps)) for i in batch]
            self._run(seqs)
            for i, s in zip(batch, seqs, strict=True):
                vocab = np.stack(s.vocab) if s.vocab else np.zeros((0, m.vocab_size), dtype=np.float32)
                # vocab_steps name steps in any order, possibly twice: the rows follow them as asked.
                order = {step: k for k, step in enumerate(sorted(set(call.items[i].vocab_steps)))}
                rows = vocab[[order[step] for step in call.items[i].vocab_steps]] if s.vocab else vocab
                outputs.append(ScoreOutput(call.items[i].item_id, np.asarray(s.logprobs, dtype=np.float32), rows))
        return ScoreResult(outputs, m.digest, None)


def load_gguf(gguf: Path, vocab_only: bool) -> Any:
    """llama.cpp's model of a GGUF file (its vocabulary alone when `vocab_only`), on the CPU."""
    lc = llama()
    mparams = lc.llama_model_default_params()
    mparams.n_gpu_layers = 0
    mparams.vocab_only = vocab_only
    model = lc.llama_model_load_from_file(str(gguf).encode(), mparams)
    if not model:
        raise MethodError(f"load_model: llama.cpp cannot read {str(gguf)!r} as a model (its reason is on the "
                          "worker's stderr); pass a GGUF file llama.cpp writes")
    return model


def check_vocabulary(gguf: Path, model_dir: str, eos_ids: frozenset[int]) -> None:
    """Refuse a folder whose tokenizer is not the GGUF's: the same text for every id, the same ids for a probe
    text, the ids that end a response inside the vocabulary. Reads the GGUF's vocabulary alone."""
    from tokenizers import Tokenizer

    from invar.errors import InvarError
    from invar.formats.tokenizer import ModelTokenizer

    lc = llama()
    try:
        core = ModelTokenizer.from_model_dir(model_dir)
        own = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    except InvarError as exc:
        raise MethodError(f"load_model: {exc}") from None
    model = load_gguf(gguf, vocab_only=True)
    try:
        vocab = lc.llama_model_get_vocab(model)
        size = int(lc.llama_vocab_n_tokens(vocab))
        if core.vocab_size != size:
            raise MethodError(f"load_model: the folder's tokenizer has {core.vocab_size} tokens, the GGUF's "
                              f"vocabulary {size}: put the tokenizer of this GGUF beside it")
        for i in range(size):
            text = lc.llama_vocab_get_text(vocab, i).decode("utf-8", "replace")
            mine = own.id_to_token(i)
            if text != mine:
                raise MethodError(f"load_model: token {i} is {text!r} in the GGUF's vocabulary but {mine!r} in the "
                                  "folder's tokenizer.json: put the tokenizer of this GGUF beside it")
        data = PROBE_TEXT.encode()
        ids = (lc.llama_token * (len(data) + 8))()
        n = lc.llama_tokenize(vocab, data, len(data), ids, len(data) + 8, False, True)
        theirs = [int(t) for t in ids[:n]]
    finally:
        lc.llama_model_free(model)
    expected = core.encode(PROBE_TEXT)
    if theirs != expected:
        at = next((k for k, (a, b) in enumerate(zip(theirs, expected, strict=False)) if a != b),
                  min(len(theirs), len(expected)))
        raise MethodError(f"load_model: llama.cpp splits the probe text {PROBE_TEXT!r} into other ids than the "
                          f"folder's tokenizer.json (from token {at}: {theirs[at:at + 4]} against "
                          f"{expected[at:at + 4]}): put the tokenizer of this GGUF beside it")
    bad = sorted(t for t in eos_ids if not 0 <= t < size)
    if bad:
        raise MethodError(f"load_model: end-of-response id {bad[0]} is outside the GGUF's vocabulary of {size}; "
                          "the folder's configs are not this GGUF's")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="invar.workers.llamacpp_worker")
    parser.add_argument("--role", choices=[r.value for r in Role], default=Role.INFERENCE.value)
    parser.add_argument("--threads", type=int, default=1, help="llama.cpp's threads (fixed: numerics may follow it)")
    parser.add_argument("--parallel", type=int, default=8,
                        help="sequences one batch may hold (llama.cpp's n_seq_max, each with its own KV cache)")
    parser.add_argument("--context", type=int, default=1024, help="positions of each sequence's KV cache")
    args = parser.parse_args(argv)
    if args.role != Role.INFERENCE.value:
        print("invar.workers.llamacpp_worker: llama.cpp serves as an inference engine only and cannot be the "
              "learner; start the learner with the hf or mlx worker (--role learner)", file=sys.stderr, flush=True)
        return 2
    if args.threads < 1 or args.parallel < 1 or args.context < 2:
        print("invar.workers.llamacpp_worker: --threads and --parallel must be ≥ 1, --context ≥ 2", file=sys.stderr,
              flush=True)
        return 2
    lc = llama()
    lc.llama_backend_init()

    @lc.llama_log_callback  # type: ignore[untyped-decorator]  # ctypes' CFUNCTYPE is unannotated
    def errors_only(level: int, text: bytes, _: Any) -> None:
        if level == GGML_LOG_LEVEL_ERROR:
            sys.stderr.write(text.decode("utf-8", "replace"))

    lc.llama_log_set(errors_only, ctypes.c_void_p(0))
    settings = Settings(args.threads, args.parallel, args.context)
    engine = Engine(settings)
    server = Server(
        engine="llamacpp",
        engine_version={"invar": __version__, **versions("llama-cpp-python", "numpy", "tokenizers"),
                        "llama_cpp_build": build_digest(), "system_info": system_info()},
        role=Role.INFERENCE,
        settings=settings.identity(),
        methods={LOAD_MODEL.name: serves(LOAD_MODEL, engine.load_model),
                 GENERATE.name: serves(GENERATE, engine.generate), SCORE.name: serves(SCORE, engine.score)},
    )
    return server.serve()


if __name__ == "__main__":
    exit_worker(main())
