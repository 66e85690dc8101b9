"""What a worker costs before and after its calls: start-up and shutdown of each engine's worker against a plain
script of the same engine, side by side, and the CLI's own start-up.

    .venv/bin/python bench/startup.py [--engines hf,mlx,vllm] [--reps 5] [--json docs/performance/startup.json]

For each engine, each repetition runs a pair in alternating order (invar first on even repetitions, the plain
script first on odd ones), so both see the same machine:

- **invar**: `invar.engines.start_worker` (a worker process, handshake, identity), then `load_model` of the shipped
  model in float32, one greedy generate of 4 tokens, and `close`, each step timed by the core, plus the whole
  from the core's start of the process to the exit status;
- **plain**: a Python process that imports the engine as a user's script would (hf: torch + transformers'
  `AutoModelForCausalLM`; vLLM: `vllm`; MLX: `mlx_lm`), loads the same folder (hf `from_pretrained`, vLLM `LLM(...)`
  with the worker's settings, MLX `mlx_lm.utils.load_model`), generates 4 greedy tokens and exits; it prints the
  time of each step, and its whole is from spawn to exit status.

Each side's CPU time (user + system of the process and of the children it waited for) is kept beside its wall
time: the worker's read from `/proc/<pid>/stat` the moment its handshake arrives (it then waits for its first call),
the plain script's from `os.times()` at its mark after importing; and each whole's, from the children's resource
usage around it (invar's adds the core's own, this process's CPU time over the steps). Wall time on a shared machine
moves with the load; CPU time much less, so the CPU ratio is the one that says what a worker's start costs.

Reported per engine: medians (min–max) of each step, the ratios invar / plain of the median handshake to the
median import and of the medians of the wholes, and the median per-pair ratios handshake / import and whole / whole
in wall and in CPU time, each with a 95 % bootstrap interval over the pairs; the load average at each pair. Also
the median wall time of `invar --help` and of `python -c "import invar.cli.app"` over `--reps` runs. The shipped
tiny model, so what shows is the fixed cost of a worker.

`--forked`: a third side per pair for HF and MLX, **forked**: the same steps as invar's, the worker forked by a
fork server that imported the engine once (`invar.transport.forkserver`; started before the pairs, its own start
reported apart). Its CPU is the worker's own from `/proc` (a forked worker is the server's child, not this
process's): at the handshake, and through its generate (its close is not counted), plus the core's. Reported: the
median per-pair ratios forked / invar of the handshake and of the whole, in wall and CPU time.

`--cli-before OTHER/src` (another checkout's `src`, e.g. `git worktree add /tmp/old HEAD~1`): the CLI's commands
(`CLI_PAIRS`: `--help`, every command's `--help`, `version`, and three that do their work without a worker:
`use prepare contracts/walkthrough.toml`, `use plan` of what it wrote, and the same plan for Hoeffding alone) run in
`--reps` alternating pairs, that version against this checkout's, each a fresh process; reported per command: the
medians (min–max) of each version's wall and CPU time and the median per-pair ratio this / before, and a table.
The walkthrough contract is prepared into each version's folder by the version before, first; `--cli-skip NAMES`
leaves out commands (`use_prepare` where this checkout's worker digests are stale). With `--engines ''` only the CLI
is measured.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from report import compile_sources, write_json

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "src") not in sys.path:  # run from a checkout without installing the package
    sys.path.insert(0, str(REPO / "src"))

from commands import median_ci95  # noqa: E402  (bench/ is on the path: this script's folder)

from invar import canonical  # noqa: E402
from invar.engines import DEFAULT_MODEL, ENGINES, start_worker, worker_env  # noqa: E402
from invar.protocol import Role  # noqa: E402
from invar.tasks import ModelTokenizer  # noqa: E402
from invar.transport import forkserver  # noqa: E402

PROMPT = "37+58="

PLAIN = {
    "hf": """
        import torch
        from transformers import AutoModelForCausalLM
        mark("import")
        model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
        mark("load")
        model.generate(torch.tensor([IDS]), max_new_tokens=4, do_sample=False)
        mark("generate")
    """,
    "vllm": """
        import vllm
        mark("import")
        llm = vllm.LLM(model=MODEL, tokenizer=MODEL, dtype="float32", enforce_eager=True, seed=0,
                       gpu_memory_utilization=0.3, max_num_seqs=256, enable_prefix_caching=False)
        mark("load")
        llm.generate([vllm.TokensPrompt(prompt_token_ids=IDS)], vllm.SamplingParams(temperature=0, max_tokens=4),
                     use_tqdm=False)
        mark("generate")
    """,
    "mlx": """
        import mlx.core as mx
        from mlx_lm.generate import generate_step
        from mlx_lm.utils import load_model
        mark("import")
        model, _ = load_model(Path(MODEL))
        mark("load")
        for _, (token, _) in zip(range(4), generate_step(mx.array(IDS), model, sampler=lambda x: mx.argmax(x, -1))):
            pass
        mark("generate")
    """,
}
"""Each engine's plain script: what a user would write to load the model and generate from it."""


def plain_script(engine: str, ids: list[int]) -> str:
    prelude = f"""
        import os, sys, time
        from pathlib import Path
        START = time.perf_counter()
        MODEL = {str(DEFAULT_MODEL)!r}
        IDS = {ids!r}
        def mark(step):
            t = os.times()
            print(f"step {{step}} {{time.perf_counter() - START:.6f}} "
                  f"{{t.user + t.system + t.children_user + t.children_system:.6f}}", file=sys.__stderr__,
                  flush=True)
    """
    return textwrap.dedent(prelude) + textwrap.dedent(PLAIN[engine])


FORKED = ("hf", "mlx")
"""The engines `--forked` also starts from a fork server."""


def children_cpu() -> float:
    """CPU seconds (user + system) of this process's children that have been waited for."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) a live process has used so far, with its children it waited for (Linux)."""
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # after the command name: state is field 3, utime..cstime fields 14-17 of proc(5)
    return sum(int(v) for v in stat[11:15]) / os.sysconf("SC_CLK_TCK")


def run_plain(engine: str, ids: list[int]) -> dict[str, float]:
    cpu_before = children_cpu()
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", plain_script(engine, ids)], env=worker_env(), capture_output=True,
                          text=True, timeout=900)
    whole = time.perf_counter() - started
    whole_cpu = children_cpu() - cpu_before
    if proc.returncode != 0:
        raise SystemExit(f"bench/startup.py: the plain {engine} script failed (exit {proc.returncode}):\n"
                         f"{proc.stderr[-2000:]}")
    marks = {line.split()[1]: (float(line.split()[2]), float(line.split()[3]))
             for line in proc.stderr.splitlines() if line.startswith("step ")}
    return {"import": marks["import"][0], "load": marks["load"][0] - marks["import"][0],
            "generate": marks["generate"][0] - marks["load"][0], "whole": whole,
            "import_cpu": marks["import"][1], "whole_cpu": whole_cpu}


def run_invar(engine: str, ids: list[int], digest: str, servers: Path | None = None) -> dict[str, float]:
    """`servers`: the fork servers' folder, to fork the worker from one (`--forked`); None: a fresh process."""
    os.environ.pop(forkserver.ENV, None)
    if servers is not None:
        os.environ[forkserver.ENV] = str(servers)
    cpu_before, core_before = children_cpu(), time.process_time()
    started = time.perf_counter()
    try:
        client = start_worker(engine, Role.INFERENCE)
    finally:
        os.environ.pop(forkserver.ENV, None)
    shook = time.perf_counter()
    forked = isinstance(client.process, forkserver.ForkedWorker)
    if forked != (servers is not None):
        raise SystemExit(f"bench/startup.py: the {engine} worker was {'' if forked else 'not '}forked")
    assert isinstance(client.process, subprocess.Popen | forkserver.ForkedWorker)  # its /proc entry is here
    pid = client.process.pid
    handshake_cpu = process_cpu(pid)
    worker_cpu = 0.0
    try:
        client.call("load_model", {"model_dir": str(DEFAULT_MODEL), "model_digest": digest, "dtype": "float32",
                                   "quantization": "none", "adapter": None})
        loaded = time.perf_counter()
        client.call("generate", {"requests": [{"request_id": "r0", "prompt": PROMPT, "prompt_ids": ids, "seed": 0,
                                               "temperature": 0.0, "top_p": 1.0, "max_tokens": 4}]})
        generated = time.perf_counter()
        if forked:
            worker_cpu = process_cpu(pid)  # not this process's child: its CPU is not in our children's usage
    finally:
        code = client.close()
    closed = time.perf_counter()
    whole_cpu = children_cpu() - cpu_before + worker_cpu + time.process_time() - core_before
    if code != 0:
        raise SystemExit(f"bench/startup.py: the {engine} worker exited with {code}")
    return {"handshake": shook - started, "load": loaded - shook, "generate": generated - loaded,
            "close": closed - generated, "whole": closed - started, "handshake_cpu": handshake_cpu,
            "whole_cpu": whole_cpu}


def timed(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True, timeout=120)
    return time.perf_counter() - started


def cpu_timed(argv: list[str]) -> float:
    """The command's CPU seconds (user + system): what it costs, less moved by other work than its wall time."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, check=True, capture_output=True, timeout=120)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


CLI_PAIRS = {"help": ["--help"], "use_help": ["use", "--help"], "use_plan_help": ["use", "plan", "--help"],
             "use_prepare_help": ["use", "prepare", "--help"],
             # every other command's help: what a command pays for its own modules before it reads its arguments
             **{"_".join(a[:-1]).replace("-", "_") + "_help": a for a in (
                 ["use", "admit", "--help"], ["use", "verify", "--help"], ["use", "run", "--help"],
                 ["use", "init", "--help"], ["use", "package", "--help"], ["infer", "--help"],
                 ["evaluate", "--help"], ["score", "--help"], ["train", "--help"], ["inspect", "--help"],
                 ["inspect", "records", "--help"], ["compare", "--help"], ["compare", "numerical", "--help"],
                 ["keys", "new", "--help"])},
             "version": ["version"],
             # a plan whose own work is small (one closed-form-like method): the start, then a little planning
             "use_plan_hoeffding": ["use", "plan", "{scratch}/walkthrough.contract.json", "--assume",
                                    "worse=0.01 better=0.01", "--method", "hoeffding", "--json"],
             # Two commands that do their work (no worker): what a command costs with the modules it uses.
             "use_prepare": ["use", "prepare", str(REPO / "contracts" / "walkthrough.toml"), "--out", "{scratch}",
                             "--json"],
             "use_plan": ["use", "plan", "{scratch}/walkthrough.contract.json", "--assume", "worse=0.01 better=0.01",
                          "--json"]}
"""Name → the arguments of `invar`; `{scratch}` is a folder of each version's own (`use_plan` reads what
`use_prepare` wrote there)."""


def cli_pairs(before_src: Path, reps: int, skip: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Each of `CLI_PAIRS` (but `skip`) from `before_src` and from this checkout, in alternating pairs: wall and CPU
    seconds. The walkthrough contract the plans read is prepared into each version's folder first, by the version
    before (so a plan is measured even where this checkout's worker digests are stale while the code changes)."""
    sources = {"before": str(before_src.resolve()), "after": str(REPO / "src")}
    scratch = {who: Path(tempfile.mkdtemp(prefix=f"invar-cli-{who}-")) for who in sources}
    for folder in scratch.values():
        walkthrough = str(REPO / "contracts" / "walkthrough.toml")
        prepare = [sys.executable, "-m", "invar.cli", "use", "prepare", walkthrough, "--out", str(folder), "--json"]
        subprocess.run(prepare, check=True, capture_output=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": sources["before"]})
    out: dict[str, Any] = {}
    for name, template in CLI_PAIRS.items():
        if name in skip:
            continue
        times: dict[str, dict[str, list[float]]] = {k: {"wall": [], "cpu": []} for k in sources}
        for rep in range(reps):
            for who in (("before", "after") if rep % 2 == 0 else ("after", "before")):
                env = {**os.environ, "PYTHONPATH": sources[who]}
                args = [a.replace("{scratch}", str(scratch[who])) for a in template]
                argv = [sys.executable, "-m", "invar.cli", *args]
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                started = time.perf_counter()
                subprocess.run(argv, check=True, capture_output=True, timeout=120, env=env)
                times[who]["wall"].append(time.perf_counter() - started)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                times[who]["cpu"].append((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
        row: dict[str, Any] = {"raw": times}
        for kind in ("wall", "cpu"):
            ratios = [a / b for a, b in zip(times["after"][kind], times["before"][kind], strict=True)]
            row[kind] = {"before": summary(times["before"][kind]), "after": summary(times["after"][kind]),
                         "ratio": summary(ratios)}
        out[name] = row
        print(f"invar {name}: CPU {row['cpu']['before']['median']:.2f} → {row['cpu']['after']['median']:.2f}"
              f" s (pair ratio {row['cpu']['ratio']['median']:.2f}), wall {row['wall']['before']['median']:.2f} → "
              f"{row['wall']['after']['median']:.2f} s (pair ratio {row['wall']['ratio']['median']:.2f})")
    for folder in scratch.values():
        shutil.rmtree(folder, ignore_errors=True)
    return out


def ratio_cell(ratio: dict[str, Any]) -> str:
    """A paired ratio as a table shows it: its median and 95 % interval."""
    return f"{ratio['median']:.2f} ({ratio['ci95'][0]:.2f}–{ratio['ci95'][1]:.2f})"


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", default="hf,mlx,vllm")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--forked", action="store_true",
                        help="also start HF and MLX workers forked from a fork server, as a third side of each pair")
    parser.add_argument("--cli-before", type=Path, default=None,
                        help="another checkout's src: pair the CLI's start against it")
    parser.add_argument("--cli-skip", default="",
                        help="comma-separated names of CLI_PAIRS not to run (e.g. use_prepare where the worker "
                             "digests are stale)")
    args = parser.parse_args(argv)
    compile_sources(REPO / "src", *([args.cli_before] if args.cli_before is not None else []))
    engines = [e for e in args.engines.split(",") if e]
    unknown = sorted(set(engines) - set(PLAIN))
    if unknown or args.reps < 1:
        parser.error(f"--engines takes {', '.join(PLAIN)} (not {', '.join(unknown)}); --reps >= 1")
    ids = ModelTokenizer.from_model_dir(DEFAULT_MODEL).prompt_ids(prompt=PROMPT)
    digest = canonical.tree_digest(DEFAULT_MODEL)
    result: dict[str, Any] = {"model": str(DEFAULT_MODEL.name), "reps": args.reps, "load_1min": os.getloadavg()[0],
                              "engines": {}}
    servers = Path(tempfile.mkdtemp(prefix="invar-forkservers-"))
    for engine in engines:
        sides = ["invar", "plain"]
        server = None
        if args.forked and engine in FORKED:
            sides.append("forked")
            started = time.perf_counter()
            server = forkserver.start(servers, ENGINES[engine], worker_env(None, engine))
            while not forkserver.socket_path(servers, ENGINES[engine]).exists():
                if server.poll() is not None:
                    raise SystemExit(f"bench/startup.py: the {engine} fork server exited with {server.returncode}")
                time.sleep(0.05)
            result.setdefault("fork_server_ready_s", {})[engine] = time.perf_counter() - started
        rows: dict[str, list[dict[str, float]]] = {who: [] for who in sides}
        loads: list[float] = []
        for rep in range(args.reps):
            loads.append(os.getloadavg()[0])
            order = sides[rep % len(sides):] + sides[:rep % len(sides)]  # each side first in turn
            for who in order:
                row = (run_plain(engine, ids) if who == "plain"
                       else run_invar(engine, ids, digest, servers if who == "forked" else None))
                rows[who].append(row)
                print(f"{engine} rep {rep + 1}/{args.reps} {who}: "
                      + ", ".join(f"{k} {v:.2f} s" for k, v in row.items()) + f" (load {os.getloadavg()[0]:.1f})",
                      file=sys.stderr, flush=True)
        steps = {who: {k: summary([r[k] for r in rs]) for k in rs[0]} for who, rs in rows.items()}
        pairs: dict[str, Any] = {}
        for name, mine, theirs in (("handshake_over_import", "handshake", "import"),
                                   ("handshake_over_import_cpu", "handshake_cpu", "import_cpu"),
                                   ("whole_over_whole_pairs", "whole", "whole"),
                                   ("whole_over_whole_cpu", "whole_cpu", "whole_cpu")):
            ratios = [i[mine] / p[theirs] for i, p in zip(rows["invar"], rows["plain"], strict=True)]
            pairs[name] = {"median": statistics.median(ratios), "ci95": median_ci95(ratios), "pairs": ratios}
        if server is not None:
            server.terminate()
            server.wait(60)
            for name, key in (("forked_over_invar_handshake", "handshake"),
                              ("forked_over_invar_handshake_cpu", "handshake_cpu"),
                              ("forked_over_invar_whole", "whole"), ("forked_over_invar_whole_cpu", "whole_cpu")):
                ratios = [f[key] / i[key] for f, i in zip(rows["forked"], rows["invar"], strict=True)]
                pairs[name] = {"median": statistics.median(ratios), "ci95": median_ci95(ratios), "pairs": ratios}
        result["engines"][engine] = {
            **steps,
            "handshake_over_import": steps["invar"]["handshake"]["median"] / steps["plain"]["import"]["median"],
            "whole_over_whole": steps["invar"]["whole"]["median"] / steps["plain"]["whole"]["median"],
            "paired": pairs,
            "load_1min_at_pair": loads,
            "raw": rows,
        }
    cli = [sys.executable, "-m", "invar.cli", "--help"]
    imports = [sys.executable, "-c", "import invar.cli.app"]
    # `use plan --help` builds one command family: what a command pays for its own module before it does anything.
    family = [sys.executable, "-m", "invar.cli", "use", "plan", "--help"]
    result["cli"] = {"help": summary([timed(cli) for _ in range(args.reps)]),
                     "use_plan_help": summary([timed(family) for _ in range(args.reps)]),
                     "import_app": summary([timed(imports) for _ in range(args.reps)]),
                     "python_alone": summary([timed([sys.executable, "-c", "pass"]) for _ in range(args.reps)]),
                     "help_cpu": summary([cpu_timed(cli) for _ in range(args.reps)]),
                     "use_plan_help_cpu": summary([cpu_timed(family) for _ in range(args.reps)])}
    if args.cli_before is not None:
        result["cli_pairs"] = cli_pairs(args.cli_before, args.reps, frozenset(filter(None, args.cli_skip.split(","))))
    result["load_1min_end"] = os.getloadavg()[0]
    print("| engine | invar handshake | plain import | invar load + generate | plain load + generate | invar close "
          "| invar whole | plain whole | handshake / import | whole / whole |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for engine, r in result["engines"].items():
        inv, pl = r["invar"], r["plain"]
        print(f"| {engine} | {inv['handshake']['median']:.2f} s | {pl['import']['median']:.2f} s "
              f"| {inv['load']['median'] + inv['generate']['median']:.2f} s "
              f"| {pl['load']['median'] + pl['generate']['median']:.2f} s | {inv['close']['median']:.2f} s "
              f"| {inv['whole']['median']:.2f} s | {pl['whole']['median']:.2f} s "
              f"| {r['handshake_over_import']:.2f} | {r['whole_over_whole']:.2f} |")
    print("\n| engine | pairs | load at each pair | invar handshake CPU | plain import CPU | handshake / import, CPU "
          "(95 %) | handshake / import, wall (95 %) | invar whole CPU | plain whole CPU | whole / whole, CPU (95 %) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for engine, r in result["engines"].items():
        inv, pl, pr = r["invar"], r["plain"], r["paired"]
        print(f"| {engine} | {len(r['load_1min_at_pair'])} | {', '.join(f'{x:.1f}' for x in r['load_1min_at_pair'])} "
              f"| {inv['handshake_cpu']['median']:.2f} s | {pl['import_cpu']['median']:.2f} s "
              f"| {ratio_cell(pr['handshake_over_import_cpu'])} | {ratio_cell(pr['handshake_over_import'])} "
              f"| {inv['whole_cpu']['median']:.2f} s | {pl['whole_cpu']['median']:.2f} s "
              f"| {ratio_cell(pr['whole_over_whole_cpu'])} |")
    forked = {e: r for e, r in result["engines"].items() if "forked" in r}
    if forked:
        print("\n| engine | fork server ready | forked handshake | invar handshake | forked / invar handshake, wall "
              "(95 %) | forked / invar handshake, CPU (95 %) | forked whole | invar whole | forked / invar whole, "
              "wall (95 %) | forked / invar whole, CPU (95 %) |")
        print("|---|---|---|---|---|---|---|---|---|---|")
    for engine, r in forked.items():
        fk, inv, pr = r["forked"], r["invar"], r["paired"]
        print(f"| {engine} | {result['fork_server_ready_s'][engine]:.2f} s | {fk['handshake']['median']:.2f} s "
              f"| {inv['handshake']['median']:.2f} s | {ratio_cell(pr['forked_over_invar_handshake'])} "
              f"| {ratio_cell(pr['forked_over_invar_handshake_cpu'])} | {fk['whole']['median']:.2f} s "
              f"| {inv['whole']['median']:.2f} s | {ratio_cell(pr['forked_over_invar_whole'])} "
              f"| {ratio_cell(pr['forked_over_invar_whole_cpu'])} |")
    c = result["cli"]
    print(f"\ninvar --help {c['help']['median']:.2f} s, invar use plan --help {c['use_plan_help']['median']:.2f} s, "
          f"import invar.cli.app {c['import_app']['median']:.2f} s, "
          f"python alone {c['python_alone']['median']:.2f} s (medians of {args.reps}); CPU time: invar --help "
          f"{c['help_cpu']['median']:.2f} s, invar use plan --help {c['use_plan_help_cpu']['median']:.2f} s")
    if "cli_pairs" in result:
        print("\n| command | CPU s before | CPU s after | after / before (median of pairs) | wall s before "
              "| wall s after |")
        print("|---|---:|---:|---:|---:|---:|")
        for name, row in result["cli_pairs"].items():
            shown = " ".join(a.replace("{scratch}/", "") for a in CLI_PAIRS[name])
            print(f"| `invar {shown}` | {row['cpu']['before']['median']:.2f} | {row['cpu']['after']['median']:.2f} "
                  f"| {row['cpu']['ratio']['median']:.2f} | {row['wall']['before']['median']:.2f} "
                  f"| {row['wall']['after']['median']:.2f} |")
    write_json(args.json, result, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
