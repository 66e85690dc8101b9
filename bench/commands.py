"""Each user-visible command against the plain script a user would write for the same engine, side by side.

    .venv/bin/python bench/commands.py [--engines hf,mlx,vllm] [--commands evaluate,score,use-run] [--reps 3]
        [--count 512] [--units 64] [--model models/tiny-arith] [--json docs/performance/commands.json]
        [--population FILE --scorer NAME --scorer-setting NAME=JSON --max-tokens N]   # evaluate on another task
        [--vllm-native plain|matched] [--vllm-declaration contracts/real-model/smollm2-vllm.toml]
        [--native-scripts together|in-turn]

For each engine and command, one unpaired warm-up run of the invar command fixes the work: its run store holds
every call it made, with the exact params (prompt token ids, sampling settings, batches). Then `--reps` pairs,
alternating which runs first (invar first on even repetitions), both as fresh processes from spawn to exit status:

- **invar**: the command as a user types it (`invar evaluate --count N --temperature 1`, `invar score --from-run`
  of that evaluate run, `invar use run` of a small contract whose two packages are the same HF model with SDPA and
  with eager attention), each run into a fresh run directory, `--json --quiet`;
- **native**: a plain Python script per worker the command starts, that imports the engine, loads the same model
  folder and its tokenizer, and runs the very calls the warm-up recorded, batch by batch, with the engine's own API
  (HF: `model.generate` on the left-padded batch with the same temperature, top-p and token budget, one
  `torch.manual_seed` per batch, and the texts decoded; `score`: one forward over the right-padded batch and
  `log_softmax` at the given tokens; MLX: `mlx_lm.batch_generate` with `make_sampler(temp, top_p)`, and the forward
  for `score`; vLLM: one `LLM` with the worker's scheduling arguments and `LLM.generate` on `TokensPrompt`s with one
  seeded `SamplingParams` per request, batch by batch, vLLM's defaults otherwise (`--vllm-native matched`: also the
  worker's environment, so the engine core runs in the script's own process as in the worker, its LoRA slots, no
  prefix caching and the sampled tokens' log-probabilities). `use run`'s two packages run as
  two such scripts at once, as its two workers start (`--native-scripts in-turn`: one after the other, as a user
  would run two engines that each use every core; `use run` itself lets such calls take turns) (on vLLM, a
  contract whose two packages are the vLLM package of `--vllm-declaration`, the candidate with `max_num_seqs` 128,
  which no batch reaches). The native scripts
  do not compute per-request seeded sampling or log-probabilities of generated tokens, keep no records and check
  nothing: the ratio is what a user pays for Invar's promises over the script they would have written.

Breakdown (seconds, from the bench's spawn of the process): **start-up** is spawn → the last model loaded (invar:
the last `load_model` report in the run store; native: each script's mark after loading); **steady state** is
then → the last generate or score answered (invar: its report's record; native: the script's mark after its last
call); **shutdown** is then → exit status (invar: the closing record, the decision or summary, printing, the
workers' exit; native: the interpreter's teardown). Reported per engine and command: medians (min–max) of each part
and of the whole, and the median per-pair ratio invar / native of the whole and of steady state, each with a 95 %
bootstrap interval (pairs resampled whole); each whole's CPU time (user + system of the command or scripts and
every process they started and waited for, from this process's children's resource usage), which moves much less
with other work on the machine than wall time, and its per-pair ratio; the load average before each pair and at
the end; and each side's peak resident memory (VmHWM, polled every 0.2 s from /proc): the invar command's own
process (the core) and its workers with their engines' processes, or the plain scripts and their engines' processes,
each summed over processes.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import tomllib
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "src") not in sys.path:  # run from a checkout without installing the package
    sys.path.insert(0, str(REPO / "src"))

import numpy as np  # noqa: E402

from invar import canonical  # noqa: E402
from invar.contract.declaration_toml import toml_document  # noqa: E402
from invar.engines import worker_digest, worker_env  # noqa: E402
from invar.records import RunStore  # noqa: E402

INVAR = [sys.executable, "-m", "invar.cli"]
COMMANDS = ("evaluate", "score", "use-run")

NATIVE_PRELUDE = """
import json, sys, time
def mark(step):
    print(f"mark {step} {time.time_ns()}", file=sys.stderr, flush=True)
MODEL, CALLS, SETTINGS = sys.argv[1], json.load(open(sys.argv[2])), json.loads(sys.argv[3])
"""

NATIVE = {
    "hf": """
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
torch.set_num_threads(int(SETTINGS.get("threads", 1)))
mark("import")
model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32,
                                             attn_implementation=SETTINGS.get("attn_implementation", "sdpa"))
model.eval()
tok = AutoTokenizer.from_pretrained(MODEL)
pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
mark("load")
with torch.no_grad():
    for method, params in CALLS:
        if method == "generate":
            reqs = params["requests"]
            for batch in params.get("layout") or [list(range(len(reqs)))]:
                prompts = [reqs[i]["prompt_ids"] for i in batch]
                width = max(len(p) for p in prompts)
                ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
                mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
                r = reqs[batch[0]]
                torch.manual_seed(r["seed"])
                sampling = ({"do_sample": True, "temperature": r["temperature"], "top_p": r["top_p"], "top_k": 0}
                            if r["temperature"] > 0 else {"do_sample": False})
                out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=r["max_tokens"],
                                     pad_token_id=pad, **sampling)
                tok.batch_decode(out[:, width:], skip_special_tokens=True)
        else:
            items = params["items"]
            for batch in params.get("layout") or [list(range(len(items)))]:
                rows = [items[i]["prompt_ids"] + items[i]["response_tokens"] for i in batch]
                width = max(len(x) for x in rows)
                ids = torch.tensor([x + [pad] * (width - len(x)) for x in rows])
                mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in rows])
                logits = model(input_ids=ids, attention_mask=mask).logits
                for j, i in enumerate(batch):
                    p, t = len(items[i]["prompt_ids"]), items[i]["response_tokens"]
                    lp = torch.log_softmax(logits[j, p - 1:p - 1 + len(t)].float() / items[i]["temperature"], -1)
                    lp.gather(-1, torch.tensor(t)[:, None]).numpy()
mark("steady")
""",
    "mlx": """
import mlx.core as mx
from mlx_lm import batch_generate, load
from mlx_lm.sample_utils import make_sampler
mark("import")
model, tok = load(MODEL)
mark("load")
for method, params in CALLS:
    if method == "generate":
        reqs = params["requests"]
        for batch in params.get("layout") or [list(range(len(reqs)))]:
            r = reqs[batch[0]]
            mx.random.seed(r["seed"])
            batch_generate(model, tok, [reqs[i]["prompt_ids"] for i in batch], max_tokens=r["max_tokens"],
                           sampler=make_sampler(temp=r["temperature"], top_p=r["top_p"]), verbose=False)
    else:
        items = params["items"]
        for batch in params.get("layout") or [list(range(len(items)))]:
            for i in batch:  # one row at a time: no padding
                x = items[i]["prompt_ids"] + items[i]["response_tokens"]
                p, t = len(items[i]["prompt_ids"]), items[i]["response_tokens"]
                logits = model(mx.array(x)[None])[0, p - 1:p - 1 + len(t)] / items[i]["temperature"]
                lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
                mx.eval(mx.take_along_axis(lp, mx.array(t)[:, None], axis=-1))
mark("steady")
""",
    "vllm": """
import os
matched = SETTINGS.get("native") == "matched"
if matched:  # the worker's recorded environment, and on one CPU device its engine core in this process, as the
    os.environ.update(SETTINGS.get("env", {}))  # worker runs it (invar.workers.vllm_worker: half the start-up)
    if SETTINGS.get("device") == "cpu" and "tensor_parallel_size" not in SETTINGS:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
mark("import")
# The engine arguments that decide how a batch is scheduled are the worker's (dtype, seed, sequences and prefill
# tokens per step, context length, eager mode); everything else is vLLM's default unless "matched" asks for the
# worker's own (its environment, LoRA slots, no prefix caching, processed log-probabilities of each sampled token).
kwargs = {k: SETTINGS[k] for k in ("max_model_len", "max_num_batched_tokens") if k in SETTINGS}
kwargs.setdefault("max_num_batched_tokens", max(16384, SETTINGS["max_num_seqs"]))
if matched:
    kwargs.update(enable_lora=True, max_lora_rank=SETTINGS["max_lora_rank"], max_loras=SETTINGS["max_loras"],
                  enable_prefix_caching=False, logprobs_mode=SETTINGS["logprobs_mode"], max_logprobs=-1,
                  lora_target_modules=SETTINGS["lora_target_modules"])
llm = LLM(model=MODEL, tokenizer=MODEL, dtype=SETTINGS.get("dtype", "float32"), seed=SETTINGS["engine_seed"],
          enforce_eager=SETTINGS["enforce_eager"], gpu_memory_utilization=SETTINGS["gpu_memory_utilization"],
          max_num_seqs=SETTINGS["max_num_seqs"], **kwargs)
mark("load")
for method, params in CALLS:
    reqs = params["requests"]
    for batch in params.get("layout") or [list(range(len(reqs)))]:
        sampling = [SamplingParams(temperature=reqs[i]["temperature"], top_p=reqs[i]["top_p"], seed=reqs[i]["seed"],
                                   max_tokens=reqs[i]["max_tokens"], **({"logprobs": 0} if matched else {}))
                    for i in batch]
        llm.generate([TokensPrompt(prompt_token_ids=reqs[i]["prompt_ids"]) for i in batch], sampling,
                     use_tqdm=False)
mark("steady")
""",
}
"""Each engine's plain script: load the folder, run the recorded calls' batches with the engine's own API."""


def recorded_work(run: Path) -> tuple[dict[str, list[tuple[str, dict[str, Any]]]], dict[str, dict[str, Any]]]:
    """The generate and score calls of a run, per worker, in order, and each worker's launch settings (with its
    engine's name under "engine" and the dtype it loaded the model in under "dtype")."""
    store = RunStore.open(run)
    calls: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    settings: dict[str, dict[str, Any]] = {}
    for rec in store.iter_calls():
        settings.setdefault(rec.worker, {}).update({**rec.identity.settings, "engine": rec.identity.engine})
        if rec.call.method == "load_model":
            settings[rec.worker]["dtype"] = rec.call.params.get("dtype", "float32")
        if rec.call.method in ("generate", "score"):
            calls.setdefault(rec.worker, []).append((rec.call.method, _plain(rec.call.params)))
    return calls, settings


def _plain(value: Any) -> Any:
    """Params as JSON: arrays (prompt ids, tokens) as lists."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def invar_breakdown(run: Path, spawned_ns: int, exited_ns: int) -> dict[str, float]:
    """start-up, steady state and shutdown of an invar command from its run store's record times."""
    store = RunStore.open(run)
    loaded, last = spawned_ns, spawned_ns
    for rec in store.iter_calls():
        if rec.report is None:
            continue
        if rec.call.method == "load_model":
            loaded = max(loaded, rec.report.at_ns)
        elif rec.call.method in ("generate", "score"):
            last = max(last, rec.report.at_ns)
    return {"startup": (loaded - spawned_ns) / 1e9, "steady": (last - loaded) / 1e9,
            "shutdown": (exited_ns - last) / 1e9, "whole": (exited_ns - spawned_ns) / 1e9}


def children_cpu() -> float:
    """CPU seconds (user + system) of this process's children that have been waited for (and of theirs)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class PeakRss(threading.Thread):
    """The peak resident memory (VmHWM) of each process under some root processes, polled every `interval`
    seconds from /proc while they run: the roots' own peaks and their descendants' (workers, engine cores), each
    summed over processes. A peak reached within the last interval before a process exits is not seen."""

    def __init__(self, roots: list[int], interval: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.roots, self.interval = set(roots), interval
        self.peaks: dict[int, int] = {}
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            parents: dict[int, int] = {}
            for entry in os.listdir("/proc"):
                if entry.isdigit():
                    try:
                        stat = Path(f"/proc/{entry}/stat").read_text()
                        parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
                    except (OSError, ValueError, IndexError):
                        continue
            tree = set(self.roots)
            grew = True
            while grew:
                more = {pid for pid, parent in parents.items() if parent in tree} - tree
                tree |= more
                grew = bool(more)
            for pid in tree:
                try:
                    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                        if line.startswith("VmHWM:"):
                            self.peaks[pid] = max(self.peaks.get(pid, 0), int(line.split()[1]))
                except OSError:
                    continue
            self.done.wait(self.interval)

    def stop(self) -> dict[str, float]:
        self.done.set()
        self.join()
        root = sum(v for pid, v in self.peaks.items() if pid in self.roots) / 1024
        rest = sum(v for pid, v in self.peaks.items() if pid not in self.roots) / 1024
        return {"peak_rss_roots_mb": root, "peak_rss_descendants_mb": rest, "processes": float(len(self.peaks))}


def run_invar(argv: list[str], run: Path) -> dict[str, float]:
    """The command in a fresh run directory; its breakdown, CPU time, and peak memory: the core's own (the roots)
    and its workers' with their engines' processes (the descendants)."""
    if run.exists():
        shutil.rmtree(run)
    cpu = children_cpu()
    started = time.time_ns()
    proc = subprocess.Popen([*INVAR, *argv, "--run", str(run), "--json", "--quiet"], env=worker_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    memory = PeakRss([proc.pid])
    memory.start()
    _, err = proc.communicate(timeout=3600)
    ended = time.time_ns()
    peaks = memory.stop()
    cpu = children_cpu() - cpu
    if proc.returncode not in (0, 10, 11):  # use admit's answers aside, a command exits 0
        raise SystemExit(f"bench/commands.py: invar {' '.join(argv)} failed (exit {proc.returncode}):\n"
                         f"{err[-2000:]}")
    return {**invar_breakdown(run, started, ended), "whole_cpu": cpu, **peaks}


def run_native(model: Path, work: list[tuple[Path, dict[str, Any]]], together: bool = True) -> dict[str, float]:
    """Every worker's plain script (its engine's, from its recorded settings) at once, as the command's workers
    run; the breakdown over all of them. `together=False`: one script after the other (what a user on a machine too
    small for both engines at once would run), each part the sum of the scripts' parts and each peak the largest."""
    if not together:
        parts = [run_native(model, [one]) for one in work]
        return {key: (max if key.startswith(("peak", "processes")) else sum)(part[key] for part in parts)
                for key in parts[0]}
    cpu = children_cpu()
    started = time.time_ns()
    procs = [subprocess.Popen([sys.executable, "-c",
                               textwrap.dedent(NATIVE_PRELUDE) + textwrap.dedent(NATIVE[settings["engine"]]),
                               str(model), str(calls), json.dumps(settings)],
                              env=worker_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for calls, settings in work]
    memory = PeakRss([p.pid for p in procs])
    memory.start()
    marks: list[dict[str, int]] = []
    for p in procs:
        _, err = p.communicate(timeout=3600)
        if p.returncode != 0:
            raise SystemExit(f"bench/commands.py: a plain engine script failed (exit {p.returncode}):\n"
                             f"{err[-2000:]}")
        marks.append({line.split()[1]: int(line.split()[2]) for line in err.splitlines() if line.startswith("mark ")})
    ended = time.time_ns()
    peaks = memory.stop()
    cpu = children_cpu() - cpu
    loaded = max(m["load"] for m in marks)
    last = max(m["steady"] for m in marks)
    return {"startup": (loaded - started) / 1e9, "steady": (last - loaded) / 1e9, "shutdown": (ended - last) / 1e9,
            "whole": (ended - started) / 1e9, "whole_cpu": cpu, **peaks}


def use_run_contract(folder: Path, units: int, model: Path) -> Path:
    """A small contract on the walkthrough's plan: two packages of the same HF model, SDPA and eager attention (no
    patch, so a plain script can run the candidate too)."""
    walkthrough = REPO / "contracts" / "walkthrough.toml"
    declared = tomllib.loads(walkthrough.read_text(encoding="utf-8"))
    assert declared["candidate"]["settings"]["attn_implementation"] == "eager"
    # The walkthrough declares the tiny model's digest; --model may be another.
    for role in ("reference", "candidate"):
        declared[role].update(model_dir=str(model), model_digest=canonical.tree_digest(model),
                              worker_digest=worker_digest("hf"))
    del declared["candidate"]["patches"]
    declared["name"] = "commands-bench"
    declared["population"]["sample"] = units
    return prepare(folder, "commands-bench", _absolute(declared, walkthrough.parent))


def vllm_use_run_contract(folder: Path, units: int, model: Path, declaration: Path) -> Path:
    """A small contract whose two packages are both the vLLM package of `declaration` (its candidate as the
    reference too, and as the candidate with max_num_seqs 128), on `units` sampled units of its population, so
    that `use run` runs vLLM only and its two workers can be set against two plain `LLM.generate` scripts. Paths
    are made absolute; the model is `model`."""
    declared = tomllib.loads(declaration.read_text(encoding="utf-8"))
    vllm = declared["candidate"]
    if vllm["engine"] != "vllm" or vllm["settings"].get("max_num_seqs") != 256:
        raise SystemExit(f"bench/commands.py: {declaration}: its candidate is not a vLLM package with max_num_seqs 256")
    vllm.update(model_dir=str(model), model_digest=canonical.tree_digest(model), worker_digest=worker_digest("vllm"))
    # Two packages must differ: the candidate schedules at most 128 sequences a step instead of 256, which no batch
    # of the contract reaches, so both run every batch the same way.
    declared["reference"] = copy.deepcopy(vllm)
    vllm["settings"]["max_num_seqs"] = 128
    declared["name"] = "commands-bench-vllm"
    declared["population"]["sample"] = units
    return prepare(folder, "commands-bench-vllm", _absolute(declared, declaration.parent))


def _absolute(declared: dict[str, Any], base: Path) -> dict[str, Any]:
    """The declaration with its population's and premises' paths made absolute (they are relative to `base`)."""
    declared["population"]["path"] = str((base / declared["population"]["path"]).resolve())
    for premise in declared.get("premises", []):
        if "basis_path" in premise:
            premise["basis_path"] = str((base / premise["basis_path"]).resolve())
    return declared


def prepare(folder: Path, name: str, declared: dict[str, Any]) -> Path:
    """Write the declaration `declared` as `name`.toml into `folder`
    (`invar.contract.declaration_toml.toml_document`) and
    `invar use prepare` it there; the contract's path."""
    decl = folder / f"{name}.toml"
    decl.write_text(toml_document(declared), encoding="utf-8")
    out = subprocess.run([*INVAR, "use", "prepare", str(decl), "--out", str(folder)], env=worker_env(),
                         capture_output=True, text=True, timeout=600, cwd=REPO)
    if out.returncode != 0:
        raise SystemExit(f"bench/commands.py: use prepare failed:\n{out.stderr[-2000:]}")
    return folder / f"{name}.contract.json"


def median_ci95(ratios: list[float], resamples: int = 4000) -> list[float]:
    """95 % percentile-bootstrap interval of the median per-pair ratio (pairs resampled whole)."""
    rng = np.random.default_rng(0)
    a = np.asarray(ratios)
    meds = [float(np.median(rng.choice(a, a.size))) for _ in range(resamples)]
    return [float(np.percentile(meds, 2.5)), float(np.percentile(meds, 97.5))]


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", default="hf,mlx")
    parser.add_argument("--commands", default=",".join(COMMANDS))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--count", type=int, default=512, help="evaluate: problems (64 per call)")
    parser.add_argument("--units", type=int, default=64, help="use run: the contract's sampled units")
    parser.add_argument("--model", type=Path, default=REPO / "models" / "tiny-arith")
    parser.add_argument("--population", type=Path, default=None, help="evaluate: the population (default: invar's)")
    parser.add_argument("--scorer", default=None, help="evaluate: the scorer (default: invar's)")
    parser.add_argument("--scorer-setting", action="append", default=[], help="evaluate: NAME=JSON, repeatable")
    parser.add_argument("--max-tokens", type=int, default=None, help="evaluate: response tokens (default: invar's)")
    parser.add_argument("--vllm-declaration", type=Path,
                        default=REPO / "contracts" / "real-model" / "smollm2-vllm.toml",
                        help="use run on vllm: the declaration whose vLLM candidate both packages are")
    parser.add_argument("--native-scripts", choices=("together", "in-turn"), default="together",
                        help="use run: the plain scripts of its two packages at once, as its workers start "
                             "(together), or one after the other (in-turn)")
    parser.add_argument("--vllm-native", choices=("plain", "matched"), default="plain",
                        help="the plain vLLM script: vLLM's defaults (plain) or the worker's engine arguments "
                             "(matched: LoRA slots, no prefix caching, the sampled tokens' log-probabilities)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    engines = [e for e in args.engines.split(",") if e]
    commands = [c for c in args.commands.split(",") if c]
    if set(engines) - set(NATIVE) or set(commands) - set(COMMANDS) or args.reps < 1:
        parser.error(f"--engines takes {', '.join(NATIVE)}; --commands {', '.join(COMMANDS)}; --reps >= 1")
    model = args.model.resolve()
    result: dict[str, Any] = {"model": str(model.relative_to(REPO) if model.is_relative_to(REPO) else model),
                              "argv": sys.argv[1:],
                              "reps": args.reps, "count": args.count, "units": args.units, "cpus": os.cpu_count(),
                              "load_at_start": os.getloadavg(), "rows": {}}
    with tempfile.TemporaryDirectory(prefix="invar-bench-commands-") as tmp:
        scratch = Path(tmp)
        for engine in engines:
            common = ["--engine", engine, "--model", str(model)]
            evaluate = ["evaluate", "--count", str(args.count), "--temperature", "1", *common]
            if args.population is not None:
                evaluate += ["--population", str(args.population.resolve())]
            if args.scorer is not None:
                evaluate += ["--scorer", args.scorer]
            for item in args.scorer_setting:
                evaluate += ["--scorer-setting", item]
            if args.max_tokens is not None:
                evaluate += ["--max-tokens", str(args.max_tokens)]
            for command in commands:
                if command == "use-run" and engine == "mlx":
                    continue  # the contracts' packages are HF's (SDPA and eager attention) or vLLM's
                warm = scratch / f"{engine}-{command}-warm"
                if command == "evaluate":
                    argv_ = evaluate
                elif command == "score":
                    source = scratch / f"{engine}-score-source"
                    if not source.exists():
                        run_invar(evaluate, source)
                    argv_ = ["score", "--from-run", str(source), *common]
                elif engine == "vllm":
                    argv_ = ["use", "run", str(vllm_use_run_contract(scratch, args.units, model,
                                                                      args.vllm_declaration.resolve()))]
                else:
                    argv_ = ["use", "run", str(use_run_contract(scratch, args.units, model))]
                run_invar(argv_, warm)  # the warm-up: fixes the calls the native scripts make
                calls, settings = recorded_work(warm)
                work = []
                for k, (worker, worker_calls) in enumerate(sorted(calls.items())):
                    path = scratch / f"{engine}-{command}-calls-{k}.json"
                    path.write_text(json.dumps(worker_calls), encoding="utf-8")
                    work.append((path, {**settings[worker], "native": args.vllm_native}))
                rows: dict[str, list[dict[str, float]]] = {"invar": [], "native": []}
                loads = [os.getloadavg()[0]]
                for rep in range(args.reps):
                    for who in (("invar", "native") if rep % 2 == 0 else ("native", "invar")):
                        row = (run_invar(argv_, scratch / f"{engine}-{command}-{rep}") if who == "invar"
                               else run_native(model, work, together=args.native_scripts == "together"))
                        rows[who].append(row)
                        print(f"{engine} {command} rep {rep + 1}/{args.reps} {who}: "
                              + ", ".join(f"{k} {v:.2f}{'' if k.startswith(('peak', 'processes')) else ' s'}"
                                          for k, v in row.items())
                              + f" (load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
                    loads.append(os.getloadavg()[0])
                entry: dict[str, Any] = {
                    who: {part: summary([r[part] for r in rs]) for part in rs[0]} for who, rs in rows.items()}
                for part in ("whole", "steady", "startup", "whole_cpu"):
                    ratios = [i[part] / n[part] for i, n in zip(rows["invar"], rows["native"], strict=True)]
                    entry[f"{part}_ratio"] = {"median": statistics.median(ratios), "ci95": median_ci95(ratios)}
                entry["calls"] = {f"worker {k}": len(c) for k, c in enumerate(calls.values())}
                entry["requests"] = sum(len(p.get("requests", p.get("items", []))) for c in calls.values()
                                        for _, p in c)
                entry["load_1min"] = loads
                entry["raw"] = rows
                result["rows"][f"{engine} {command}"] = entry
                if args.json is not None:  # each row as it is measured: a later failure keeps the ones before
                    write_json(args.json, {**result, "load_at_end": os.getloadavg()})
    result["load_at_end"] = os.getloadavg()
    print("| engine | command | invar whole | native whole | whole ratio (95 %) | invar start-up | native start-up "
          "| invar steady | native steady | steady ratio (95 %) | invar shutdown | native shutdown | invar whole CPU "
          "| native whole CPU | whole CPU ratio (95 %) | load at each pair |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, e in result["rows"].items():
        i, n = e["invar"], e["native"]
        w, s, c = e["whole_ratio"], e["steady_ratio"], e["whole_cpu_ratio"]
        print(f"| {' | '.join(name.split())} | {i['whole']['median']:.2f} s | {n['whole']['median']:.2f} s "
              f"| {w['median']:.2f} ({w['ci95'][0]:.2f}–{w['ci95'][1]:.2f}) | {i['startup']['median']:.2f} s "
              f"| {n['startup']['median']:.2f} s | {i['steady']['median']:.2f} s | {n['steady']['median']:.2f} s "
              f"| {s['median']:.2f} ({s['ci95'][0]:.2f}–{s['ci95'][1]:.2f}) | {i['shutdown']['median']:.2f} s "
              f"| {n['shutdown']['median']:.2f} s | {i['whole_cpu']['median']:.2f} s "
              f"| {n['whole_cpu']['median']:.2f} s | {c['median']:.2f} ({c['ci95'][0]:.2f}–{c['ci95'][1]:.2f}) "
              f"| {', '.join(f'{x:.1f}' for x in e['load_1min'])} |")
    if args.json is not None:
        write_json(args.json, result)
    return 0


def write_json(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
