"""Read a LoRA adapter directory, PEFT's or mlx-lm's, into one form per module.

PEFT (what vLLM loads): ``adapter_config.json`` + ``adapter_model.safetensors`` with
``base_model.model.<module>.lora_A.weight`` [r, in] and ``...lora_B.weight`` [out, r];
the scale is lora_alpha / r (or / sqrt(r) with rsLoRA), per module through
rank_pattern / alpha_pattern, as vLLM's PEFTHelper computes it.

mlx-lm (``mlx_lm.lora``'s output): ``adapter_config.json`` with ``lora_parameters``
(rank, scale) + ``adapters.safetensors`` with ``<module>.lora_a`` [in, r] and
``<module>.lora_b`` [r, out]; the scale is lora_parameters["scale"].

Either way a module's update is ``scale * B @ A @ x`` with A [r, in] and B [out, r].
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import mlx.core as mx

if TYPE_CHECKING:
    from vllm.config import LoRAConfig


# Leads every refusal's message, so the API server can tell a refused adapter (a
# 400 for its client) from a failure of the server (vllm_metal/lora/http_errors.py).
REFUSED = "LoRA adapter refused: "


class AdapterError(ValueError):
    """An adapter this server cannot apply; the message says what is wrong with it."""

    def __init__(self, message: str) -> None:
        super().__init__(REFUSED + message)


@dataclass(frozen=True)
class ModuleUpdate:
    """One target module's low-rank update: scale * B @ A."""

    a: mx.array   # [r, in] float32
    b: mx.array   # [out, r] float32
    scale: float

    @property
    def rank(self) -> int:
        return self.a.shape[0]


def read_adapter(path: str, lora_config: LoRAConfig,
                 max_position_embeddings: int | None = None) -> dict[str, ModuleUpdate]:
    """The adapter at PATH as {module path in the mlx-lm model: update}."""
    root = Path(path)
    if not (root / "adapter_config.json").is_file():
        raise AdapterError(f"no LoRA adapter at {path}: adapter_config.json not found")
    config = json.loads((root / "adapter_config.json").read_text())
    if (root / "adapter_model.safetensors").is_file():
        updates = _read_peft(root, config, lora_config, max_position_embeddings)
    elif (root / "adapters.safetensors").is_file():
        updates = _read_mlx_lm(root, config)
    elif (root / "adapter_model.bin").is_file():
        raise AdapterError(f"{path}: adapter_model.bin (a pickle) is not read; save the "
                           "adapter as safetensors (PEFT's save_pretrained does by default)")
    else:
        raise AdapterError(f"{path}: no adapter_model.safetensors (PEFT) or "
                           "adapters.safetensors (mlx-lm) next to adapter_config.json")
    if not updates:
        raise AdapterError(f"{path}: the adapter holds no LoRA weights")
    for name, update in updates.items():
        if update.rank > lora_config.max_lora_rank:
            raise AdapterError(f"{path}: {name} has rank {update.rank}, above "
                               f"--max-lora-rank {lora_config.max_lora_rank} (raise it)")
    return updates


def _read_peft(root: Path, config: dict, lora_config: LoRAConfig,
               max_position_embeddings: int | None) -> dict[str, ModuleUpdate]:
    from vllm.lora.peft_helper import PEFTHelper

    try:
        helper = PEFTHelper.from_dict({**config,
                                       "vllm_max_position_embeddings": max_position_embeddings})
        helper.validate_legal(lora_config)
    except ValueError as e:
        raise AdapterError(f"{root}: {e}") from None
    tensors = mx.load(str(root / "adapter_model.safetensors"))
    pairs: dict[str, dict[str, mx.array]] = {}
    for key, value in tensors.items():
        name = key.removeprefix("base_model.model.")
        for part, leaf in ((".lora_A.weight", "a"), (".lora_B.weight", "b")):
            if name.endswith(part):
                pairs.setdefault(name.removesuffix(part), {})[leaf] = value
                break
        else:
            raise AdapterError(f"{root}: tensor {key} is not a LoRA A/B weight (embedding, "
                               "lm_head and other adapter kinds are not served)")
    updates = {}
    for module, pair in pairs.items():
        _require_pair(root, module, pair)
        _, scale = helper.get_rank_and_scaling(module)
        updates[module] = _update(root, module, pair["a"], pair["b"], scale)
    return updates


def _read_mlx_lm(root: Path, config: dict) -> dict[str, ModuleUpdate]:
    kind = config.get("fine_tune_type", "lora")
    if kind != "lora":
        raise AdapterError(f"{root}: mlx-lm fine_tune_type {kind!r} is not served "
                           "(only 'lora'; fuse a DoRA or full fine-tune into the model)")
    params = config.get("lora_parameters") or {}
    if "scale" not in params:
        raise AdapterError(f"{root}: adapter_config.json has no lora_parameters.scale")
    scale = float(params["scale"])
    pairs: dict[str, dict[str, mx.array]] = {}
    for key, value in mx.load(str(root / "adapters.safetensors")).items():
        module, _, leaf = key.rpartition(".")
        if leaf not in ("lora_a", "lora_b"):
            raise AdapterError(f"{root}: tensor {key} is not a LoRA weight (lora_a/lora_b)")
        # mlx-lm multiplies x @ lora_a @ lora_b: its matrices are ours transposed.
        pairs.setdefault(module, {})[leaf[-1]] = value.T
    updates = {}
    for module, pair in pairs.items():
        _require_pair(root, module, pair)
        updates[module] = _update(root, module, pair["a"], pair["b"], scale)
    return updates


def _require_pair(root: Path, module: str, pair: dict) -> None:
    missing = {"a", "b"} - pair.keys()
    if missing:
        raise AdapterError(f"{root}: {module} has no LoRA {'/'.join(sorted(missing)).upper()} "
                           "matrix")


def _update(root: Path, module: str, a: mx.array, b: mx.array, scale: float) -> ModuleUpdate:
    if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[1]:
        raise AdapterError(f"{root}: {module} has LoRA matrices of shapes {tuple(a.shape)} "
                           f"and {tuple(b.shape)}, which do not make a rank-r pair")
    return ModuleUpdate(a.astype(mx.float32), b.astype(mx.float32), scale)
