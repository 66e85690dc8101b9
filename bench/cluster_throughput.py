"""`use run --ray` across 1, 2 and 3 worker nodes of a real multi-node Ray cluster on this machine.

    .venv/bin/python bench/cluster_throughput.py [--samples 32 128] [--json OUT.json]     (as root)

The cluster is the tests' (tests/cluster/netns_cluster.py): a head and three worker nodes, each in its own network
namespace with its own address on a bridge, started with Ray's own `ray start` (the head with `--num-cpus 0`, so no
worker goes there). The same plan (the HF tiny model, FP32 against NF4, layouts solo and b4) is run with one worker
per package per worker node (`--workers N` on N nodes), and with two local workers for reference, each at two
plan sizes (`--samples`: units of the population). For each:

- calls per second over the calling phase of the larger plan (first planned call sent, when every worker has started
  and passed its identity check, to the last report recorded);
- the head's own CPU per call: the `invar` command's (user + system of the reaped child) and that of the head node's
  Ray processes (GCS, raylet, agents: /proc of every process in the head's namespace, before and after);
- the bytes moved per call: received plus sent on the head's port of the bridge (everything the head exchanged with
  the worker nodes, Ray's own traffic included).

The per-call figures are the difference between the two plan sizes over the difference in calls, so what every run
pays once (starting and checking the workers, joining the cluster) cancels out; for local workers the command's CPU
includes its workers'.

All nodes share this machine's cores, so calls per second here says little about real machines; the head's CPU and
bytes per call are what carry over. Needs root (network namespaces).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests" / "cluster")]

from netns_cluster import NetnsCluster, netns_cluster  # noqa: E402

from invar import canonical  # noqa: E402
from invar.engines import DEFAULT_MODEL  # noqa: E402
from invar.records import RunStore  # noqa: E402
from invar.runner.engine import Engine, probe_identity  # noqa: E402

POPULATION = ROOT / "data" / "arith-eval.jsonl"
TICK = os.sysconf("SC_CLK_TCK")


def declaration(folder: Path, sample: int) -> Path:
    folder.mkdir()
    ident = probe_identity(Engine.HF)
    package = {"engine": "hf", "engine_version": ident.engine_version, "settings": ident.settings,
               "model_dir": str(DEFAULT_MODEL), "model_digest": canonical.tree_digest(DEFAULT_MODEL),
               "dtype": "float32"}

    def value(v: Any) -> str:
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{json.dumps(k)} = {json.dumps(x)}" for k, x in v.items()) + " }"
        return json.dumps(v)

    lines = [
        'name = "cluster-bench"',
        "[population]", f'path = "{POPULATION}"',
        f'sha256 = "{POPULATION.with_suffix(".sha256").read_text().split()[0]}"', f"sample = {sample}",
        "[scorer]", 'name = "arithmetic-exact"',
        "[sampling]", "temperature = 1.0", "max_tokens = 5",
        "[requirement]", 'standard = "population"', 'epsilon = "0.5"', 'confidence = "0.95"',
        'method = "paired-binary-exact"',
        "[pairing]", "seed = 11", 'layout = "solo"',
        "[layouts.solo]", "batch_size = 1", "[layouts.b4]", "batch_size = 4",
        "[invariance]", "required = true", 'layouts = ["solo", "b4"]',
        "[execution]", "requests_per_call = 2",
        "[reference]", *(f"{k} = {value(v)}" for k, v in package.items()),
        "[candidate]", *(f"{k} = {value(v)}" for k, v in {**package, "quantization": "nf4"}.items()),
    ]
    decl = folder / "cluster-bench.toml"
    decl.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = subprocess.run([sys.executable, "-m", "invar.cli", "use", "prepare", str(decl)], capture_output=True,
                         text=True, timeout=600)
    if out.returncode != 0:
        raise SystemExit(out.stderr)
    return folder / "cluster-bench.contract.json"


def cpu_seconds(pids: list[int]) -> dict[int, float]:
    found = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        found[pid] = (int(fields[11]) + int(fields[12])) / TICK
    return found


def port_bytes(cluster: NetnsCluster) -> int:
    out = subprocess.run(["ip", "-s", "-j", "-n", cluster.ns("sw"), "link", "show", cluster.head.port],
                         capture_output=True, text=True, check=True)
    stats = json.loads(out.stdout)[0]["stats64"]
    return int(stats["rx"]["bytes"]) + int(stats["tx"]["bytes"])


def measure(cluster: NetnsCluster, contract: Path, run: Path, nodes: int | None) -> dict[str, Any]:
    """One run: on `nodes` worker nodes (one worker per package on each), or local workers when None."""
    args = ["use", "run", str(contract), "--run", str(run), "--json", "--quiet"]
    if nodes is not None:
        args += ["--ray", cluster.address, "--workers", str(nodes)]
    head_before = cpu_seconds(cluster.pids("head"))
    bytes_before = port_bytes(cluster)
    started, children = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
    # `ip netns exec` execs the command: the child reaped here is the `invar` process itself (with, for local
    # workers, the workers it reaped: the whole run's CPU on this machine).
    out = subprocess.run(cluster.argv("head", sys.executable, "-m", "invar.cli", *args), env=cluster.env(),
                         capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.monotonic() - started
    if out.returncode != 0:
        raise SystemExit(out.stderr[-3000:])
    invar_cpu = after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime
    head_after = cpu_seconds(list(head_before))
    moved = port_bytes(cluster) - bytes_before
    doc = json.loads(out.stdout)
    with RunStore.open(run) as store:
        calls = store.calls()
        placed = [v for k, v in store.meta().items() if k.startswith("placement ")]
    # The calling phase: from the first planned call sent (every worker has started and passed its identity check
    # by then) to the last report recorded.
    first = min(c.at_ns for c in calls if c.call.method == "generate")
    last = max(c.report.at_ns for c in calls if c.report is not None)
    planned = sum(1 for c in calls if c.at_ns >= first)
    phase = (last - first) / 1e9
    ray_cpu = sum(head_after[p] - head_before[p] for p in head_after)
    return {"worker_nodes": nodes, "workers": len(placed) if nodes is not None else 2,
            "nodes_used": sorted({p["node_ip"] for p in placed}), "calls": len(calls), "planned_calls": planned,
            "calls_total": doc["calls_total"], "wall_s": round(wall, 2), "calling_phase_s": round(phase, 2),
            "calls_per_s": round(planned / phase, 2), "invar_cpu_s": round(invar_cpu, 2),
            "head_ray_cpu_s": round(ray_cpu, 2), "head_port_bytes": moved}


def per_call(small: dict[str, Any], large: dict[str, Any]) -> dict[str, Any]:
    """What one more call costs the head: the difference of two plans' runs over the difference of their calls
    (what every run pays once, starting workers and joining the cluster, cancels out)."""
    calls = large["calls"] - small["calls"]
    return {"worker_nodes": large["worker_nodes"], "workers": large["workers"], "nodes_used": large["nodes_used"],
            "calls_per_s": large["calls_per_s"], "calls": [small["calls"], large["calls"]],
            "wall_s": [small["wall_s"], large["wall_s"]],
            "invar_cpu_ms_per_call": round(1000 * (large["invar_cpu_s"] - small["invar_cpu_s"]) / calls, 1),
            "head_ray_cpu_ms_per_call": round(1000 * (large["head_ray_cpu_s"] - small["head_ray_cpu_s"]) / calls, 1),
            "bytes_per_call": round((large["head_port_bytes"] - small["head_port_bytes"]) / calls),
            "runs": [small, large]}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, nargs=2, default=[32, 128], metavar=("SMALL", "LARGE"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="invar-cluster-bench-") as tmp:
        folder = Path(tmp)
        contracts = [declaration(folder / f"s{n}", n) for n in args.samples]
        rows = []
        with netns_cluster(folder / "ray", workers=3) as cluster:
            for spare in ("w2", "w3"):  # grown one node at a time
                cluster.kill_node(spare)
            cluster.wait_alive({cluster.head.ip, cluster.nodes["w1"].ip})
            for n in (None, 1, 2, 3):
                if n is not None and n > 1:
                    cluster.revive(f"w{n}")
                    cluster.wait_alive({cluster.head.ip, *(cluster.nodes[f"w{i}"].ip for i in range(1, n + 1))})
                runs = [measure(cluster, c, folder / f"run-{n}-{i}", n) for i, c in enumerate(contracts)]
                rows.append(per_call(*runs))
                print(json.dumps(rows[-1]), flush=True)
    result = {"command": "sudo .venv/bin/python bench/cluster_throughput.py " + " ".join(sys.argv[1:]),
              "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.platform(),
              "cores": os.cpu_count(), "load_before": load, "samples": args.samples, "rows": rows}
    text = json.dumps(result, indent=2)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
