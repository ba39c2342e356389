"""Vision towers of vision-language checkpoints, in MLX (mlx-vlm's modules).

mlx-lm loads a VLM checkpoint's language model and drops its vision weights;
this module loads those weights into mlx-vlm's tower and projector for the
checkpoint's ``model_type`` and turns one image item, as vLLM's processor made
it (``MultiModalFeatureSpec.data``: torch tensors by key), into the rows that
replace the item's placeholder embeddings, exactly as many as vLLM's
``embed_multimodal`` gives for it (``PlaceholderRange.get_num_embeds``).

Only the tower is built here: mlx-vlm's whole ``Model`` would also build a second
language model. mlx-vlm is MIT-licensed and imported, not copied.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

if TYPE_CHECKING:
    import torch

# Checkpoint key prefixes of the vision weights, transformers 5's first: the
# key is stored without them.
_PREFIXES = ("model.vision_tower.", "vision_tower.", "model.multi_modal_projector.",
             "multi_modal_projector.", "model.visual.", "visual.")


class VisionTower:
    """One checkpoint's image encoder: ``encode(items)`` -> one float array
    [num_embeds_i, text_hidden] per item, in the model's dtype (lazy)."""

    modality = "image"

    def __init__(self, config: dict, weights: dict[str, mx.array], dtype: mx.Dtype) -> None:
        self.config = config
        self.dtype = dtype
        self.modules = self._build(config)
        self.modules.load_weights(list(self._sanitize(weights).items()), strict=True)
        self.modules.set_dtype(dtype)
        mx.eval(self.modules.parameters())

    def encode(self, items: list[dict[str, torch.Tensor]]) -> list[mx.array]:
        raise NotImplementedError

    def _build(self, config: dict) -> nn.Module:
        raise NotImplementedError

    def _sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        return weights


class LlavaTower(VisionTower):
    """LLaVA-1.5: a CLIP/SigLIP tower, one of its hidden layers (without CLS under
    the "default" strategy), a GELU MLP projector. Item: pixel_values [3, H, W]."""

    def _build(self, config: dict) -> nn.Module:
        from mlx_vlm.models.llava.config import ModelConfig, TextConfig, VisionConfig
        from mlx_vlm.models.llava.llava import LlavaMultiModalProjector
        from mlx_vlm.models.llava.vision import VisionModel

        vision = VisionConfig.from_dict(config["vision_config"])
        text = TextConfig.from_dict({**config["text_config"], "rope_scaling": None})
        cfg = ModelConfig(text_config=text, vision_config=vision, model_type="llava")
        modules = nn.Module()
        modules.vision_tower = VisionModel(vision)
        modules.multi_modal_projector = LlavaMultiModalProjector(cfg)
        layer = config.get("vision_feature_layer", -2)
        self.layers = [layer] if isinstance(layer, int) else list(layer)
        self.strategy = config.get("vision_feature_select_strategy", "default")
        if self.strategy not in ("default", "full"):
            raise ValueError(f"vision_feature_select_strategy {self.strategy!r} is not "
                             "supported (default or full)")
        return modules

    def _sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        # Hub checkpoints nest the CLIP tower's keys under vision_model; transformers 5
        # saves them without it.
        nested = {}
        for key, value in weights.items():
            if key.startswith("vision_tower.") and not key.startswith("vision_tower.vision_model."):
                key = "vision_tower.vision_model." + key.removeprefix("vision_tower.")
            nested[key] = value
        return self.modules.vision_tower.sanitize(nested)

    def encode(self, items: list[dict[str, torch.Tensor]]) -> list[mx.array]:
        if any("image_embeds" in item for item in items):
            return [_given_embeds(item, self.dtype) for item in items]
        pixels = mx.stack([_to_mx(item["pixel_values"], self.dtype) for item in items])
        _, _, states = self.modules.vision_tower(pixels.transpose(0, 2, 3, 1),
                                                 output_hidden_states=True)
        picked = [states[i] for i in self.layers]
        if self.strategy == "default":
            picked = [s[:, 1:] for s in picked]
        features = self.modules.multi_modal_projector(mx.concatenate(picked, axis=-1))
        return list(features)


# model_type -> its tower.
TOWERS: dict[str, type[VisionTower]] = {"llava": LlavaTower}


def vision_model_type(config: dict) -> str | None:
    """The ``model_type`` of a checkpoint config whose images this module encodes."""
    kind = config.get("model_type")
    return kind if kind in TOWERS else None


def load_vision_tower(path: str | Path, dtype: mx.Dtype) -> VisionTower | None:
    """The tower of the checkpoint at ``path`` (None: not a served VLM)."""
    path = Path(path)
    config = json.loads((path / "config.json").read_text())
    kind = vision_model_type(config)
    if kind is None:
        return None
    return TOWERS[kind](config, _vision_weights(path), dtype)


def _vision_weights(path: Path) -> dict[str, mx.array]:
    """The checkpoint's vision and projector tensors, keyed without the model prefix
    (``vision_tower.…``, ``multi_modal_projector.…``)."""
    weights = {}
    for file in sorted(path.glob("*.safetensors")):
        for key, value in mx.load(str(file)).items():
            for prefix in _PREFIXES:
                if key.startswith(prefix):
                    weights[prefix.removeprefix("model.") + key[len(prefix):]] = value
                    break
    if not weights:
        raise ValueError(f"{path}: no vision weights (keys starting with one of {_PREFIXES})")
    return weights


def _to_mx(tensor: torch.Tensor, dtype: mx.Dtype) -> mx.array:
    return mx.array(tensor.detach().float().numpy()).astype(dtype)


def _given_embeds(item: dict[str, Any], dtype: mx.Dtype) -> mx.array:
    embeds = item["image_embeds"]
    return mx.array(np.asarray(embeds.detach().float().numpy())).astype(dtype)
