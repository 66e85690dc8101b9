"""One vLLM inference worker per test session (engine start-up is the slow part), and the adapters its tests load.

The worker loads the shipped model, `invar.engines.DEFAULT_MODEL`, in float32. Tests share the process, so a test
that loads an adapter uses a name of its own. Adapters are built here with PEFT on the shipped model (r=8 on q_proj
and v_proj, weights drawn from seeded generators so they change the outputs), plus one built on a model of other
dimensions and one whose weights file is cut short.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from invar.engines import start_worker
from invar.tasks import ModelTokenizer
from invar.transport import WorkerClient


@pytest.fixture(scope="session")
def load_params(model_dir: Path, model_digest: str) -> dict[str, Any]:
    """`load_model` params for the shipped model in float32."""
    return {"model_dir": str(model_dir), "model_digest": model_digest, "dtype": "float32",
            "quantization": "none", "adapter": None}


@pytest.fixture(scope="session")
def worker(load_params: dict[str, Any]) -> Iterator[WorkerClient]:
    """The session's vLLM worker, model loaded and warmed up by one greedy request (its start-up is printed)."""
    started = time.perf_counter()
    client = start_worker("vllm")
    try:
        handshake = time.perf_counter()
        client.call("load_model", load_params)
        loaded = time.perf_counter()
        ids = ModelTokenizer.from_model_dir(load_params["model_dir"]).prompt_ids(prompt="1+1=")
        client.call("generate", {"requests": [{"request_id": "warm-up", "prompt": "1+1=", "prompt_ids": ids,
                                               "seed": 0, "temperature": 0.0, "top_p": 1.0, "max_tokens": 2}]})
        print(f"measured: worker start {handshake - started:.1f} s, first load_model {loaded - handshake:.1f} s, "
              f"first generate {time.perf_counter() - loaded:.1f} s")
        yield client
    finally:
        client.close()


@dataclass(frozen=True)
class Adapters:
    a: Path
    """A LoRA adapter on the shipped model (seed 1)."""
    b: Path
    """Another one (seed 2): loading it under the same name as `a` must change the outputs."""
    other_base: Path
    """A LoRA adapter on a model of other dimensions (hidden 64)."""
    corrupt: Path
    """`a` with its weights file cut short."""


def build_adapter(base: Any, out: Path, seed: int) -> None:
    """PEFT LoRA r=8 on q_proj, v_proj with every A and B entry drawn N(0, 0.1²) from a generator seeded `seed`."""
    import torch
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
    model.save_pretrained(out)
    model.unload()  # takes the LoRA layers out again, so the next adapter starts from the plain base


@pytest.fixture(scope="session")
def adapters(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Adapters:
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

    root = tmp_path_factory.mktemp("adapters")
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    build_adapter(base, root / "a", seed=1)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    build_adapter(base, root / "b", seed=2)
    torch.manual_seed(0)
    other = Qwen3ForCausalLM(Qwen3Config(vocab_size=17, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=1, head_dim=32))
    build_adapter(other, root / "other", seed=3)
    corrupt = root / "corrupt"
    corrupt.mkdir()
    for f in (root / "a").iterdir():
        data = f.read_bytes()
        (corrupt / f.name).write_bytes(data[: len(data) // 2] if f.suffix == ".safetensors" else data)
    return Adapters(a=root / "a", b=root / "b", other_base=root / "other", corrupt=corrupt)
