"""Random LoRA adapters for a local checkpoint, in PEFT's and mlx-lm's formats, and the
checkpoint with an adapter merged into its weights (W + scale * B @ A, in float64):
the reference a served adapter must equal."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


def random_updates(model_dir: Path, targets=ATTENTION + MLP, rank: int = 8, seed: int = 0,
                   gain: float = 0.5) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{module path (model.layers.i.self_attn.q_proj...): (A [r, in], B [out, r])} for every
    TARGETS linear of the float checkpoint at MODEL_DIR."""
    rng = np.random.default_rng(seed)
    weights = _weights(model_dir)
    updates = {}
    for name, w in sorted(weights.items()):
        module = name.removesuffix(".weight")
        if not name.endswith(".weight") or module.rsplit(".", 1)[-1] not in targets:
            continue
        out_dim, in_dim = w.shape
        a = rng.normal(0, gain / np.sqrt(in_dim), (rank, in_dim)).astype(np.float32)
        b = rng.normal(0, gain / np.sqrt(rank), (out_dim, rank)).astype(np.float32)
        updates[module] = (a, b)
    return updates


def write_peft(path: Path, updates: dict, rank: int, alpha: float, **config) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for module, (a, b) in updates.items():
        tensors[f"base_model.model.{module}.lora_A.weight"] = a
        tensors[f"base_model.model.{module}.lora_B.weight"] = b
    save_file(tensors, str(path / "adapter_model.safetensors"))
    targets = sorted({m.rsplit(".", 1)[-1] for m in updates})
    (path / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": rank, "lora_alpha": alpha, "target_modules": targets,
        "bias": "none", "task_type": "CAUSAL_LM", **config}))
    return path


def write_mlx_lm(path: Path, updates: dict, rank: int, scale: float) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for module, (a, b) in updates.items():
        tensors[f"{module}.lora_a"] = np.ascontiguousarray(a.T)
        tensors[f"{module}.lora_b"] = np.ascontiguousarray(b.T)
    save_file(tensors, str(path / "adapters.safetensors"))
    (path / "adapter_config.json").write_text(json.dumps({
        "fine_tune_type": "lora", "num_layers": -1,
        "lora_parameters": {"rank": rank, "scale": scale, "dropout": 0.0}}))
    return path


def merged_checkpoint(model_dir: Path, updates: dict, scale: float, out: Path) -> Path:
    """MODEL_DIR's files with each updated weight replaced by W + scale * B @ A."""
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(model_dir, out)
    for file in out.glob("*.safetensors"):
        tensors = load_file(str(file))
        for name in list(tensors):
            module = name.removesuffix(".weight")
            if name.endswith(".weight") and module in updates:
                a, b = updates[module]
                w = tensors[name].astype(np.float64) + scale * (b.astype(np.float64) @ a)
                tensors[name] = w.astype(tensors[name].dtype)
        save_file(tensors, str(file), metadata={"format": "pt"})
    return out


def _weights(model_dir: Path) -> dict[str, np.ndarray]:
    weights = {}
    for file in Path(model_dir).glob("*.safetensors"):
        weights.update(load_file(str(file)))
    return weights
