"""The gallery of agent-style kernels, decided end to end the way an agent walks the loop (docs/kernels.md).

    .venv/bin/python scripts/kernel_gallery.py [--model tiny|smollm2|DIR] [--sample N] [--kernel NAME_OR_DIR ...]
        [--contract proposed|invariance]

For every kernel, from a new folder of its own (a function kernel or a `patch.py` folder is copied there first, as an
agent's fresh kernel would be; a shipped patch keeps its name):

1. `invar use init k.toml --candidate-patch KERNEL --sample N --temperature 0`: the contract `use init` proposes for a
   kernel (`--contract proposed`, the default: the task bound, `max_kl` on teacher-forced captures and determinism,
   the pairing layout run twice relative to the stock reference); with `--contract invariance`, `use init
   --invariance --no-determinism`: the batch-invariant base on both sides, less the ops the kernel replaces on the
   candidate's, invariance relative to the reference, `max_kl`, the task bound (the gallery's earlier column);
2. `invar use prepare k.toml`, 3. `invar use run k.contract.json --run run`, 4. `invar use admit run --json`,

each step timed; then, from the same records, the decision under the task bound alone (the recorded bound put
through the core's own `bound_answer`, as docs/kernel-contracts.md's "task bound only" column), the absolute
invariance verdict (the candidate's own layout differences), `invar compare numerical --json`'s headline and, for a
function kernel, `invar kernel check --json`'s op-level verdicts (random inputs and the model's captured inputs).

Writes docs/kernels/gallery_<model>.json after every kernel (a stopped run keeps what it finished), prints a
progress line per step on stderr and the markdown table on stdout at the end, and a PNG beside the JSON. The two
contracts are two columns of one JSON: a kernel's entry holds the invariance contract's decision (with the kernel
check) at its top and the proposed contract's under `proposed`; a run of one contract keeps the other's entries as
they were (the JSON's `columns` says which command made each). The kernel check is not run again for the proposed
contract (its verdicts do not depend on the contract).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
import tomllib
from decimal import Decimal
from pathlib import Path
from typing import Any

from invar.contract.decide import bound_answer
from invar.stats.bounds import Bound

REPO = Path(__file__).resolve().parents[1]
INVAR = [sys.executable, "-m", "invar.cli"]

GALLERY: dict[str, tuple[str, str]] = {
    # name: (where, class): where is a folder under the repository, or a shipped patch name
    "fixed-block": ("fixed-block", "correct, batch-invariant"),
    "split-k": ("split-k", "correct, batch-variant"),
    "softmax-fp32": ("examples/kernels/softmax-fp32", "correct, padding-variant (stock row sum)"),
    "silu-fp32": ("examples/kernels/silu-fp32", "correct, elementwise"),
    "softmax-bf16": ("examples/kernels/softmax-bf16", "silent precision downgrade"),
    "bf16-matmul": ("tests/contract/kernels/bf16-matmul", "silent precision downgrade"),
    "matmul-cached": ("examples/kernels/matmul-cached", "stale or cached output"),
    "matmul-tall-tail": ("examples/kernels/matmul-tall-tail", "shape-specialised"),
    "softmax-poly-exp": ("examples/kernels/softmax-poly-exp", "approximated transcendental"),
    "matmul-random-split": ("examples/kernels/matmul-random-split", "nondeterministic reduction order"),
}
"""The gallery, in table order."""

MODELS: dict[str, list[str]] = {
    "tiny": [],
    "smollm2": ["--model", "models/smollm2-135m-instruct", "--population", "data/chat-eval.jsonl",
                "--scorer", "numeric", "--max-tokens", "8"],
}
"""`use init` options per model preset (the tiny model is `use init`'s default)."""

CONTRACTS: dict[str, list[str]] = {
    "proposed": [],
    "invariance": ["--invariance", "--no-determinism"],
}
"""`use init` options per contract: what it proposes for a kernel, or the batch-invariant base with invariance."""

CONTRACT_TEXT = {
    "proposed": "as use init --candidate-patch proposes it (the stock reference; the task bound, measurements with "
                "max_kl, determinism: the pairing layout run twice, each later run in a fresh worker, relative to the "
                "reference; no batch invariance), --temperature 0",
    "invariance": "use init --candidate-patch --invariance --no-determinism (the batch-invariant base on both sides, "
                  "less the kernel's ops on the candidate's; invariance relative to the reference over its layouts, "
                  "measurements with max_kl, the task bound), --temperature 0",
}

CHECK_MODELS: dict[str, list[str]] = {
    "tiny": [],
    "smollm2": ["--model", "models/smollm2-135m-instruct", "--population", "data/chat-eval.jsonl"],
}


def log(message: str) -> None:
    print(f"[kernel_gallery {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def invar(args: list[str], cwd: Path, timeout: float) -> tuple[subprocess.CompletedProcess[str], float]:
    """One `invar` command in `cwd`, and its wall time in seconds."""
    start = time.monotonic()
    try:
        done = subprocess.run([*INVAR, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                              check=False)
    except subprocess.TimeoutExpired:
        done = subprocess.CompletedProcess([*INVAR, *args], 124, "", f"timed out after {timeout:.0f} s")
    return done, round(time.monotonic() - start, 1)


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:600] if lines else ""


def task_bound_only(decision: dict[str, Any]) -> str | None:
    """The answer the recorded task bound gives on its own: the core's `bound_answer` on the same bound."""
    b = decision.get("bound")
    if b is None or decision.get("delta") is None:
        return None
    bound = Bound(method=b["method"], version=b["version"], n=b["n"], delta=b["delta"], estimate=b["estimate"],
                  lower=b["lower"], upper=b["upper"])
    answer, _ = bound_answer(bound, Decimal(decision["epsilon"]), Decimal(decision["delta"]))
    return answer.value


def summarise_decision(decision: dict[str, Any]) -> dict[str, Any]:
    inv = decision["invariance"]
    loss = decision["task_loss"]
    meas = decision.get("measurements") or {}
    req = meas.get("requirement") or {}
    return {
        "answer": decision["answer"],
        "exit_code": decision["exit_code"],
        "reason": decision["reason"],
        "invariance": {k: inv.get(k) for k in ("relative_to", "holds", "units", "units_differing",
                                                "reference_units_differing", "candidate_units_differing")},
        "absolute_invariance_holds": inv.get("candidate_units_differing", inv["units_differing"]) == 0,
        "task_loss": {k: loss.get(k) for k in ("n", "reference_loss", "candidate_loss", "worse", "better")},
        "bound": None if decision.get("bound") is None else
        {k: decision["bound"][k] for k in ("method", "lower", "upper")},
        "epsilon": decision["epsilon"],
        "task_bound_only": task_bound_only(decision),
        "max_kl_requirement": {k: req.get(k) for k in ("max_kl", "captures", "holds", "violated", "worst")}
        if req else None,
        "determinism": None if decision.get("determinism") is None else
        {k: decision["determinism"][k] for k in ("layout", "runs", "holds", "units", "units_differing",
                                                  "candidate_units_differing", "reference_units_differing")},
    }


def numerical_headline(report: dict[str, Any]) -> dict[str, Any]:
    """What `compare numerical` prints first: how many units are bit-identical, where the tokens part, how far
    teacher forcing moves a step, and the captures' largest KL."""
    gen = report.get("generation") or {}
    tf = report.get("teacher_forcing") or {}
    caps = report.get("captures") or {}
    first = gen.get("first_divergence") or {}
    return {
        "units": gen.get("units"), "bit_identical": gen.get("identical"),
        "tokens_identical": gen.get("tokens_identical"),
        "first_divergence": first,
        "teacher_forcing_abs_delta_max": (tf.get("abs_delta") or {}).get("max"),
        "kl_ref_cand_max": (caps.get("kl_ref_cand") or {}).get("max"),
        "kl_ref_cand_mean": (caps.get("kl_ref_cand") or {}).get("mean"),
        "captures": caps.get("captures"),
    }


def op_verdicts(report: dict[str, Any]) -> dict[str, Any]:
    def short(v: dict[str, Any]) -> dict[str, Any]:
        return {"inputs": v["inputs"], "allclose_1e-2": v["allclose"]["0.01"], "allclose_1e-4": v["allclose"]["0.0001"],
                "bit_identical": v["bit_identical"], "max_ulp": v["max_ulp"], "nonfinite": v["nonfinite"]}

    def where(first: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if first is None else \
            {k: first[k] for k in ("layout", "index", "shapes", "fails", "nonfinite", "max_ulp")}

    reuse = report["reuse"]
    return {"random": short(report["random"]), "solo": short(report["model"]["solo"]),
            "batched": short(report["model"]["batched"]),
            "first_disagreement": where(report.get("first_disagreement")),
            # the reuse probe, a verdict of its own: the same tensor objects called again (repeated random inputs,
            # and the model's calls replayed in order with its weights), which a new call never shows
            "reuse": {"repeated": short(reuse["repeated"]), "replay": short(reuse["replay"]),
                      "weights_kept": reuse["weights_kept"], "first_disagreement": where(reuse["first_disagreement"])}}


def resolve(kernel: str) -> tuple[str, Path | None, str]:
    """(name, folder to copy or None for a shipped patch name, class)."""
    if kernel in GALLERY:
        where, klass = GALLERY[kernel]
        folder = REPO / where
        return kernel, folder if folder.is_dir() else None, klass
    folder = Path(kernel).resolve()
    if not folder.is_dir():
        raise SystemExit(f"kernel_gallery: --kernel {kernel}: neither a gallery name ({', '.join(GALLERY)}) nor a "
                         "folder; pass one of those")
    return folder.name, folder, "given"


def one_kernel(kernel: str, model: str, sample: int, epsilon: str | None, work: Path, prompts: int,
               timeout: float, contract: str = "invariance") -> dict[str, Any]:
    name, folder, klass = resolve(kernel)
    home = work / (name if contract == "invariance" else f"{name}-{contract}")
    if home.exists():
        shutil.rmtree(home)
    home.mkdir(parents=True)
    if folder is not None:
        shutil.copytree(folder, home / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        reference = f"./{name}"
    else:
        reference = name
    out: dict[str, Any] = {"class": klass, "candidate_patch": reference, "steps_s": {}}
    model_args = [a if not a.startswith(("models/", "data/")) else str(REPO / a) for a in MODELS[model]] \
        if model in MODELS else ["--model", str(Path(model).resolve())]
    init = ["use", "init", "k.toml", "--candidate-patch", reference, "--sample", str(sample), "--temperature", "0",
            *model_args, *(["--epsilon", epsilon] if epsilon else []), *CONTRACTS[contract]]
    steps: list[tuple[str, list[str]]] = [
        ("init", init), ("prepare", ["use", "prepare", "k.toml"]),
        ("run", ["use", "run", "k.contract.json", "--run", "run"]),
        ("admit", ["use", "admit", "run", "--contract", "k.contract.json", "--json"])]
    for step, args in steps:
        log(f"{name}: use {step} ...")
        done, seconds = invar(args, home, timeout)
        out["steps_s"][step] = seconds
        log(f"{name}: use {step} exit {done.returncode} in {seconds} s")
        if step == "init" and done.returncode == 0:
            out["base"] = base_of(home / "k.toml", done.stdout)
        if step == "admit" and done.returncode in (0, 10, 11):
            out["decision"] = summarise_decision(json.loads(done.stdout))
        elif done.returncode != 0:
            out["decision"] = None
            out["stopped"] = {"step": step, "exit_code": done.returncode, "line": last_line(done.stderr)}
            break
    out["new_folder_to_decision_s"] = round(sum(out["steps_s"].values()), 1)
    if out.get("decision") is not None:
        log(f"{name}: {out['decision']['answer']}: {out['decision']['reason'][:160]}")
        done, seconds = invar(["compare", "numerical", "run", "--contract", "k.contract.json", "--json", "--quiet"],
                              home, timeout)
        out["compare_numerical_s"] = seconds
        out["compare_numerical"] = numerical_headline(json.loads(done.stdout)) if done.returncode == 0 else \
            {"error": last_line(done.stderr)}
    if contract == "invariance" and folder is not None and (folder / "kernel.toml").is_file():
        out.update(kernel_check(name, home, model, prompts, timeout))
    return out


def kernel_check(name: str, home: Path, model: str, prompts: int, timeout: float) -> dict[str, Any]:
    """`invar kernel check --json` on the copy `home/name`: its verdicts (random, the model's inputs, reuse) as the
    gallery keeps them, its wall time, and the command that made them."""
    log(f"{name}: kernel check ...")
    check_args = [a if not a.startswith(("models/", "data/")) else str(REPO / a)
                  for a in CHECK_MODELS.get(model, ["--model", str(Path(model).resolve())])]
    args = ["kernel", "check", f"./{name}", "--json", "--prompts", str(prompts), *check_args]
    done, seconds = invar(args, home, timeout)
    return {"kernel_check_s": seconds,
            "kernel_check_command": " ".join(["invar", *args]).replace(str(REPO) + "/", ""),
            "kernel_check": op_verdicts(json.loads(done.stdout)) if done.returncode == 0 else
            {"error": last_line(done.stderr)}}


def check_only(kernels: list[str], model: str, prompts: int, work: Path, timeout: float,
               results: dict[str, Any], out: Path) -> None:
    """`--check-only`: `invar kernel check` again for the function kernels among `kernels`, its verdicts put into
    the gallery's entries beside their decisions, which are not run again (the check is a diagnostic beside the
    decision and does not change it)."""
    for kernel in kernels:
        name, folder, _ = resolve(kernel)
        entry = results["kernels"].get(name)
        if folder is None or not (folder / "kernel.toml").is_file() or entry is None:
            log(f"{name}: no function kernel with a decision in the gallery; skipped")
            continue
        home = work / f"{name}-check"
        if home.exists():
            shutil.rmtree(home)
        home.mkdir(parents=True)
        shutil.copytree(folder, home / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        entry.update(kernel_check(name, home, model, prompts, timeout))
        out.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")


def base_of(declaration: Path, said: str) -> dict[str, Any]:
    """The patches each side of the proposed contract runs (the batch-invariant base and the kernel), and what
    `use init` said about the base."""
    decl = tomllib.loads(declaration.read_text(encoding="utf-8"))
    line = next((x for x in said.splitlines() if "batch-invariant base" in x), None)
    return {"reference": sorted(decl["reference"].get("patches", {})),
            "candidate": sorted(decl["candidate"].get("patches", {})), "said": line}


def frac(v: dict[str, Any], key: str) -> str:
    return f"{v[key]}/{v['inputs']}"


def proposed_cells(r: dict[str, Any]) -> str:
    """The proposed contract's cells: answer, reason, determinism (candidate / reference units differing between
    runs), loss, max KL, new folder → decision; "not run" where the entry has none."""
    p = r.get("proposed")
    if p is None:
        return "not run | – | – | – | – | – | "
    d = p.get("decision")
    if d is None:
        stop = p.get("stopped", {})
        return (f"no decision | use {stop.get('step')} exit {stop.get('exit_code')}: "
                f"{stop_line(stop.get('line', ''))} | – | – | – | {p['new_folder_to_decision_s']:.0f} s | ")
    det = d.get("determinism")
    runs = "not checked" if det is None else \
        f"{det['candidate_units_differing']} / {det['reference_units_differing']}"
    loss = d["task_loss"]
    return (f"**{d['answer']}** | {short_reason(d['reason'])} | {runs} | {loss['reference_loss']} → "
            f"{loss['candidate_loss']} ({loss['worse']}/{loss['better']}) | {max_kl(p, d)} | "
            f"{p['new_folder_to_decision_s']:.0f} s (run {p['steps_s'].get('run', 0):.0f} s) | ")


def max_kl(r: dict[str, Any], d: dict[str, Any]) -> str:
    kl = d["max_kl_requirement"]
    cn = r.get("compare_numerical", {})
    if isinstance(cn, dict) and cn.get("kl_ref_cand_max") is not None:
        return f"{cn['kl_ref_cand_max']:.2g}"
    if kl and kl.get("worst"):
        return str(kl["worst"].split("= ")[1].split(" ")[0])
    return "–"


def table(results: dict[str, Any]) -> str:
    rows = ["| kernel | class | op-level: random allclose 1e-2, 1e-4 | model inputs (solo / batched) allclose 1e-2 "
            "| reuse: repeated / replayed allclose 1e-2 | proposed contract | reason "
            "| differ between runs: cand / ref | loss ref → cand (worse/better) | max KL | new folder → decision "
            "| invariance on the base | reason | gained / lost / ref varies / cand varies | task bound only | "
            "loss ref → cand (worse/better) | max KL | new folder → decision |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in results["kernels"].items():
        kc = r.get("kernel_check")
        reuse = reuse_cell(kc)
        if kc is None:
            op, model_in = "– (a patch.py patch)", "–"
        elif "error" in kc:
            op, model_in = f"refused: {kc['error']}", "–"
        else:
            op = f"{frac(kc['random'], 'allclose_1e-2')}, {frac(kc['random'], 'allclose_1e-4')}"
            model_in = f"{frac(kc['solo'], 'allclose_1e-2')} / {frac(kc['batched'], 'allclose_1e-2')}"
            nonfinite = kc["solo"]["nonfinite"] + kc["batched"]["nonfinite"]
            if nonfinite:
                model_in += f" (NaN on {nonfinite})"
        d = r.get("decision")
        if d is None:
            stop = r.get("stopped", {})
            rows.append(f"| `{name}` | {r['class']} | {op} | {model_in} | {reuse} | {proposed_cells(r)}no decision "
                        f"| use {stop.get('step')} "
                        f"exit {stop.get('exit_code')}: {stop_line(stop.get('line', ''))} | – | – | – | – | "
                        f"{r['new_folder_to_decision_s']:.0f} s |")
            continue
        inv = d["invariance"]
        loss = d["task_loss"]
        worst = max_kl(r, d)
        steps = r["steps_s"]
        rows.append(
            f"| `{name}` | {r['class']} | {op} | {model_in} | {reuse} | {proposed_cells(r)}**{d['answer']}** "
            f"| {short_reason(d['reason'])} | "
            f"{layout_counts(inv)} | "
            f"{d['task_bound_only'] or '–'} | {loss['reference_loss']} → {loss['candidate_loss']} "
            f"({loss['worse']}/{loss['better']}) | {worst} | {r['new_folder_to_decision_s']:.0f} s "
            f"(run {steps.get('run', 0):.0f} s) |")
    return "\n".join(rows)


def reuse_cell(kc: dict[str, Any] | None) -> str:
    """The kernel check's reuse verdict: repeated random calls and the model's replayed calls allclose at 1e-2 to
    the stock op on the same values."""
    if kc is None or "error" in kc:
        return "–"
    if "reuse" not in kc:
        return "not run"
    reuse = kc["reuse"]
    cell = f"{frac(reuse['repeated'], 'allclose_1e-2')} / {frac(reuse['replay'], 'allclose_1e-2')}"
    if reuse["first_disagreement"] is not None:
        return f"**{cell}**: answers from an earlier call"
    whole = all(reuse[k]["allclose_1e-2"] == reuse[k]["inputs"] for k in ("repeated", "replay"))
    return cell if whole else f"{cell} (what new calls fail)"


def op_level_note(kc: dict[str, Any] | None) -> str:
    """The op-level check in a few words for the PNG: which of its verdicts fail at 1e-2 (random inputs, the model's
    inputs) and whether reuse fails what a new call passes."""
    if kc is None:
        return "patch.py: no kernel check"
    if "error" in kc:
        return "kernel check refused"
    fails = [label for label, parts in (("random", [kc["random"]]), ("model", [kc["solo"], kc["batched"]]))
             if any(v["allclose_1e-2"] < v["inputs"] or v["nonfinite"] for v in parts)]
    if "reuse" in kc and kc["reuse"]["first_disagreement"] is not None:
        fails.append("reuse")
    return "op-level 1e-2: " + ("all pass" if not fails else "fails " + ", ".join(fails)) + \
        ("" if "reuse" in kc else " (reuse not run)")


def stop_line(line: str) -> str:
    """The refusal without the `invar: error:` prefix and the resume advice."""
    return line.removeprefix("invar: error: ").split("; the forward")[0][:220]


def layout_counts(inv: dict[str, Any]) -> str:
    """gained / lost / reference varies / candidate varies; "not checked" where the run closed before the layouts
    (a non-finite candidate call)."""
    if inv.get("reference_units_differing") is None and not inv.get("units"):
        return "not checked"
    return (f"{inv['units_differing']} / {lost(inv)} / {inv['reference_units_differing']} / "
            f"{inv['candidate_units_differing']}")


def lost(inv: dict[str, Any]) -> int | str:
    """Units the reference varies on and the candidate does not: with the gained units, whether a kernel added layout
    dependence (gained well above lost) or moved the stock engine's own dependence onto other units (about equal)."""
    if inv.get("reference_units_differing") is None:
        return "–"
    return int(inv["reference_units_differing"] - (inv["candidate_units_differing"] - inv["units_differing"]))


def short_reason(reason: str) -> str:
    if reason.startswith("invariance relative to the reference: "):
        return reason.split(";")[0].removeprefix("invariance relative to the reference: ").split(" across")[0]
    if reason.startswith("determinism: "):
        return reason.removeprefix("determinism: ").split(" (")[0].split(";")[0]
    if reason.startswith("measurements: "):
        return "KL " + reason.split("= ")[1].split(" ")[0] + " > max_kl"
    if reason.startswith("upper bound "):
        return reason.split(" on the mean")[0] + " ≤ ε"
    return reason.split(" (")[0][:120]


def plot(results: dict[str, Any], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    names, times, colours, notes = [], [], [], []
    palette = {"Admitted": "tab:green", "Violated": "tab:red", "Unknown": "tab:orange"}
    for name, entry in results["kernels"].items():
        r = entry.get("proposed", entry)  # the proposed contract's decision and time where it was run
        names.append(name)
        times.append(r["new_folder_to_decision_s"])
        notes.append(op_level_note(entry.get("kernel_check")))
        d = r.get("decision")
        colours.append(palette.get(d["answer"], "grey") if d else "grey")
    fig, ax = plt.subplots(figsize=(8, 0.4 * len(names) + 1.2))
    ax.barh(names[::-1], times[::-1], color=colours[::-1])
    for y, (t, note) in enumerate(zip(times[::-1], notes[::-1], strict=True)):
        ax.text(t, y, f" {note}", va="center", fontsize=7)
    ax.set_xlim(0, max(times, default=1) * 1.9)
    ax.set_xlabel("new kernel folder → decision (s): use init + prepare + run + admit")
    ax.set_title(f"kernel gallery on {results['model']} (the proposed contract where it was run)\n"
                 "green Admitted, red Violated, orange Unknown, grey no decision")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--model", default="tiny", help="tiny, smollm2 or a model folder")
    parser.add_argument("--sample", type=int, default=400, help="units per contract (use init --sample)")
    parser.add_argument("--epsilon", default=None, help="use init --epsilon (default: use init's)")
    parser.add_argument("--kernel", action="append", default=None,
                        help="a gallery name or a kernel folder (repeatable; default: the whole gallery)")
    parser.add_argument("--prompts", type=int, default=8, help="invar kernel check --prompts")
    parser.add_argument("--work", type=Path, default=Path("/tmp/kernel-gallery"), help="where the folders go")
    parser.add_argument("--out", type=Path, default=None, help="default docs/kernels/gallery_<model>.json")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per command")
    parser.add_argument("--table", type=Path, default=None,
                        help="print the table of a gallery JSON, draw its PNG beside it, and stop")
    parser.add_argument("--contract", choices=list(CONTRACTS), default="proposed",
                        help="proposed: what use init proposes for a kernel (the task bound, max_kl, determinism); "
                             "invariance: use init --invariance --no-determinism (the batch-invariant base)")
    parser.add_argument("--check-only", action="store_true",
                        help="run only invar kernel check for the function kernels and put its verdicts into the "
                             "gallery JSON's entries, leaving their decisions as they are")
    args = parser.parse_args(argv)
    if args.table is not None:
        done = json.loads(args.table.read_text(encoding="utf-8"))
        plot(done, args.table.with_suffix(".png"))
        print(table(done))
        return 0
    if args.sample < 1:
        print("kernel_gallery: --sample must be at least 1", file=sys.stderr)
        return 2
    label = args.model if args.model in MODELS else Path(args.model).name
    out = args.out or REPO / "docs" / "kernels" / f"gallery_{label}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    kernels = args.kernel or list(GALLERY)
    previous: dict[str, Any] = json.loads(out.read_text(encoding="utf-8")) if out.is_file() else {}
    if args.check_only:
        if not previous.get("kernels"):
            print(f"kernel_gallery: --check-only: {out} holds no gallery to add the kernel check to; run the gallery "
                  "first, or name its JSON with --out", file=sys.stderr)
            return 2
        check_only(kernels, args.model, args.prompts, args.work.resolve(), args.timeout, previous, out)
        plot(previous, out.with_suffix(".png"))
        print(table(previous))
        return 0
    command = "python scripts/kernel_gallery.py " + " ".join(argv if argv is not None else sys.argv[1:])
    kept = previous.get("sample") == args.sample
    columns = dict(previous.get("columns", {})) if kept else {}
    if kept and "invariance" not in columns and "command" in previous:  # a JSON from before the proposed column
        columns["invariance"] = {"command": previous["command"], "contract": previous.get("contract")}
    columns[args.contract] = {"command": command, "contract": CONTRACT_TEXT[args.contract]}
    results: dict[str, Any] = {
        # The top-level command and contract are the invariance column's, as before the proposed column existed.
        "command": command if args.contract == "invariance" else previous.get("command", ""),
        "model": label, "sample": args.sample, "epsilon": args.epsilon or "use init's default",
        "contract": CONTRACT_TEXT["invariance"] if args.contract == "invariance" or not kept else
        previous.get("contract", CONTRACT_TEXT["invariance"]),
        "columns": columns,
        "kernels": dict(previous.get("kernels", {})) if kept else {}}
    started = time.monotonic()
    for i, kernel in enumerate(kernels, 1):
        log(f"kernel {i}/{len(kernels)}: {kernel} ({args.contract} contract)")
        name = resolve(kernel)[0]
        entry = one_kernel(kernel, args.model, args.sample, args.epsilon, args.work.resolve(), args.prompts,
                           args.timeout, args.contract)
        if args.contract == "invariance":
            proposed = results["kernels"].get(name, {}).get("proposed")
            results["kernels"][name] = {**entry, **({} if proposed is None else {"proposed": proposed})}
        else:
            entry.pop("class")
            results["kernels"].setdefault(name, {"class": resolve(kernel)[2], "steps_s": {},
                                                 "new_folder_to_decision_s": 0.0})["proposed"] = entry
        out.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    order = [n for n in GALLERY if n in results["kernels"]] + [n for n in results["kernels"] if n not in GALLERY]
    results["kernels"] = {n: results["kernels"][n] for n in order}
    out.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    plot(results, out.with_suffix(".png"))
    log(f"done in {time.monotonic() - started:.0f} s: {out}")
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
