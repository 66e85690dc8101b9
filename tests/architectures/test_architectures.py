"""Six architecture families on HF and MLX (and vLLM on the two with local attention), through the workers: the same
prompt ids, the same greedy tokens, log-probabilities within `TOLERANCE` of HF's on the same tokens, and the
effective configuration each engine reports equal to the folder's `config.json` as transformers reads it; or a
refusal in one line, naming the field, before any generate call.

The tolerance (scripts/architecture_table.py): the engines compute the same float32 model with other kernels and
summation orders; measured 8.6e-6 to 7.6e-5 nats where the configuration is the folder's (vLLM's Gemma 2, 3.1e-3,
is the one exception: its CPU attention soft-capping), 1e-2 and more where MLX's configuration is not the folder's.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import architecture_table as table
import pytest
from conftest import CHANGED_THETA

from invar.engines import start_worker
from invar.formats.model_config import ConfigMismatch, check_effective, differences, folder_config, read_config
from invar.transport import WorkerClient

pytestmark = pytest.mark.engine

FAMILIES = tuple(table.FAMILIES)
EXPECTED_MLX_REFUSAL = {
    "mistral": "sliding_window: the folder's config.json gives [8, 8], the engine computes with [null, null]",
    "gemma2": "sliding_window: the folder's config.json gives [8, null], the engine computes with [null, null]",
    "gemma3": "embed_scale: the folder's config.json gives 9.797959, the engine computes with 9.8125",
}
"""What MLX (mlx-lm 0.32) cannot compute of these folders, as its refusal says it."""


def _agrees(reference: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    c = table.compare(reference, row)
    assert c["prompt_ids_equal"], (row["prompt_ids"], reference["prompt_ids"])
    return c


@pytest.mark.parametrize("family", FAMILIES)
def test_hf_computes_the_folder_s_configuration(hf_runs: dict[str, dict[str, Any]], family_dirs: dict[str, Path],
                                               family: str) -> None:
    row = hf_runs[family]
    assert row["status"] == "runs", row.get("refusal")
    assert differences(folder_config(read_config(family_dirs[family])), row["effective_config"]) == []


@pytest.mark.parametrize("family", FAMILIES)
def test_mlx_runs_the_same_model_or_refuses_in_one_line(mlx_worker: WorkerClient, hf_runs: dict[str, dict[str, Any]],
                                                        family_dirs: dict[str, Path], family: str) -> None:
    row = table.run_one(mlx_worker, "mlx", family_dirs[family])
    expected = EXPECTED_MLX_REFUSAL.get(family)
    if expected is None:
        assert row["status"] == "runs", row.get("refusal")
        c = _agrees(hf_runs[family], row)
        assert c["greedy_equal"], (row["tokens"], hf_runs[family]["tokens"])
        assert c["max_abs_delta_logprob"] <= table.TOLERANCE
        assert table.config_equal(family_dirs[family], row) is True
        return
    assert row["status"] == "refused"
    assert expected in row["refusal"], row["refusal"]
    assert "\n" not in row["refusal"]
    if row["refused_by"] == "effective configuration" and "scored" in row:
        # measured past the refusal: what it keeps out is a real gap, far outside the tolerance
        assert _agrees(hf_runs[family], row)["max_abs_delta_logprob"] > 100 * table.TOLERANCE
    elif row["refused_by"] == "effective configuration":
        assert row["measured"].startswith("fails: generate:"), row  # mlx-lm's Gemma 2 cannot even run it


def test_mlx_builds_gemma3_s_rope_per_layer_type(gemma3_changed: Path) -> None:
    from mlx_lm.utils import load_model

    from invar.workers.effective import mlx_effective
    from invar.workers.mlx_worker import rope_overrides

    want = folder_config(read_config(gemma3_changed))
    assert want["rope_theta"] == [CHANGED_THETA["sliding_attention"], CHANGED_THETA["full_attention"]]
    model, config = load_model(gemma3_changed, model_config=rope_overrides(gemma3_changed))
    mapped = mlx_effective(model, config)
    assert mapped["rope_theta"] == want["rope_theta"]
    assert mapped["sliding_window"] == want["sliding_window"] == [8, None]
    assert [d.split(":")[0] for d in differences(want, mapped)] == ["embed_scale"]
    alone, config = load_model(gemma3_changed)  # what mlx-lm builds of the folder by itself
    unmapped = mlx_effective(alone, config)
    assert unmapped["rope_theta"] == [10_000.0, 10_000.0]
    assert unmapped["sliding_window"] == [8, 8]
    assert {d.split(":")[0] for d in differences(want, unmapped)} == {"rope_theta", "sliding_window", "embed_scale"}


def test_hf_follows_a_changed_rope_theta(hf_worker: WorkerClient, gemma3_changed: Path) -> None:
    row = table.run_one(hf_worker, "hf", gemma3_changed)
    assert row["effective_config"]["rope_theta"] == pytest.approx(
        [CHANGED_THETA["sliding_attention"], CHANGED_THETA["full_attention"]], rel=1e-4)
    assert table.config_equal(gemma3_changed, row) is True


def test_the_core_refuses_a_field_in_one_line_unless_it_is_a_premise(family_dirs: dict[str, Path]) -> None:
    engine = {**folder_config(read_config(family_dirs["gemma3"])), "embed_scale": 9.8125}
    with pytest.raises(ConfigMismatch) as refused:
        check_effective(family_dirs["gemma3"], "mlx", engine)
    line = str(refused.value)
    assert "\n" not in line
    assert "embed_scale: the folder's config.json gives 9.797959, the engine computes with 9.8125" in line, line
    assert check_effective(family_dirs["gemma3"], "mlx", engine, premises=("embed_scale",)) == [
        "embed_scale: the folder's config.json gives 9.797959, the engine computes with 9.8125"]


@pytest.fixture(scope="module", params=["mistral", "gemma3-changed"])
def vllm_run(request: pytest.FixtureRequest, family_dirs: dict[str, Path],
             gemma3_changed: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    """One vLLM worker per folder (it holds one model for its life): Mistral, and Gemma 3 with θ changed."""
    folder = gemma3_changed if request.param == "gemma3-changed" else family_dirs[request.param]
    client = start_worker("vllm")
    try:
        yield folder, table.run_one(client, "vllm", folder)
    finally:
        client.close()


def test_vllm_computes_the_folder_s_model(vllm_run: tuple[Path, dict[str, Any]], hf_worker: WorkerClient) -> None:
    folder, row = vllm_run
    assert row["status"] == "runs", row.get("refusal")
    assert table.config_equal(folder, row) is True, row["effective_config"]
    c = _agrees(table.run_one(hf_worker, "hf", folder), row)
    assert c["greedy_equal"], c
    assert c["max_abs_delta_logprob"] <= table.TOLERANCE, c


def test_infer_refuses_an_engine_that_computes_another_model(family_dirs: dict[str, Path], tmp_path: Path) -> None:
    import subprocess
    import sys

    from invar.records import RunStore

    run = tmp_path / "infer-mlx-gemma3"
    done = subprocess.run([sys.executable, "-m", "invar.cli", "infer", "12+34=", "--engine", "mlx", "--model",
                           str(family_dirs["gemma3"]), "--temperature", "0", "--run", str(run), "--quiet"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "embed_scale: the folder's config.json gives 9.797959, the engine computes with 9.8125" in lines[0]
    with RunStore.open(run) as store:
        methods = [c.call.method for c in store.iter_calls()]
    assert methods == ["load_model"]  # refused before any generate call


def test_a_package_running_mlx_lm_as_installed_declares_its_rope(family_dirs: dict[str, Path],
                                                                 tmp_path: Path) -> None:
    """`map_rope_parameters = false` (the contracts about mlx-lm as installed): θ 10,000 instead of the folder's
    500,000 is the package's premise, so the session runs; no other field is."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "invar.cli", "infer", "12+34=", "--engine", "mlx", "--setting",
                           "map_rope_parameters=false", "--model", str(family_dirs["llama"]), "--temperature", "0",
                           "--max-tokens", "2", "--run", str(tmp_path / "as-installed"), "--quiet", "--json"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]


def test_vllm_reports_how_its_cpu_attention_soft_caps_gemma2(family_dirs: dict[str, Path]) -> None:
    """vLLM 0.32's CPU attention computes Gemma 2's attention soft-cap with a polynomial exp (`fast_exp`) where its
    library is built for AVX-512, std::tanh elsewhere: the worker reports which, so the first is refused in one line
    (or declared a known premise) where every other field equals the folder's."""
    import platform

    import torch

    client = start_worker("vllm")
    try:
        row = table.run_one(client, "vllm", family_dirs["gemma2"])
    finally:
        client.close()
    fast = platform.machine().lower() in ("x86_64", "amd64") and torch.cpu._is_avx512_supported()
    assert row["effective_config"]["attn_softcap_tanh"] == ("fast_exp" if fast else "tanh")
    others = {**row["effective_config"], "attn_softcap_tanh": "tanh"}
    assert differences(folder_config(read_config(family_dirs["gemma2"])), others) == []
    if fast:
        assert row["status"] == "refused"
        assert row["refused_by"] == "effective configuration"
        assert "attn_softcap_tanh: the folder's config.json gives \"tanh\", the engine computes with \"fast_exp\"" \
            in row["refusal"], row["refusal"]
        assert "\n" not in row["refusal"]
