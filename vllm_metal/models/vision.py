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

import contextlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

if TYPE_CHECKING:
    import torch

    from vllm_metal.backend import Backend

# Checkpoint key prefixes of the vision weights, transformers 5's first: the
# key is stored without them.
_PREFIXES = ("model.vision_tower.", "vision_tower.", "model.multi_modal_projector.",
             "multi_modal_projector.", "model.visual.", "visual.")


class VisionTower:
    """One checkpoint's image encoder: ``encode(items)`` -> one float array
    [num_embeds_i, text_hidden] per item, in the model's dtype (lazy)."""

    modality = "image"
    # Levels of rows added inside the language model after its first layers (the
    # encoded rows are that many times wider than the text hidden size, plus one).
    deepstack_levels = 0

    def __init__(self, config: dict, weights: dict[str, mx.array], dtype: mx.Dtype,
                 backend: Backend) -> None:
        self.config = config
        self.dtype = dtype
        self.backend = backend
        with _processors_untouched():
            self.modules = self._build(config)
        self.modules.load_weights(list(self._sanitize(weights).items()), strict=True)
        self.modules.set_dtype(dtype)
        backend.prepare_weights(self.modules)   # the CPU backend's linears, as the LM's
        mx.eval(self.modules.parameters())

    def encode(self, items: list[dict[str, torch.Tensor]]) -> list[mx.array]:
        # One item at a time: an image's rows never depend on what else the step
        # encodes (greedy output is the same alone and in a batch). Evaluated inside
        # the backend's encoder context, whose kernels replace MLX's there.
        out = []
        with self.backend.encoder_context():
            for item in items:
                rows = (_given_embeds(item, self.dtype) if "image_embeds" in item
                        else self._encode_one(item))
                mx.eval(rows)
                out.append(rows)
        return out

    def _encode_one(self, item: dict[str, torch.Tensor]) -> mx.array:
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
        return self.modules.vision_tower.sanitize(_nested_vision_model(weights))

    def _encode_one(self, item: dict[str, torch.Tensor]) -> mx.array:
        pixels = _to_mx(item["pixel_values"], self.dtype)[None]
        _, _, states = self.modules.vision_tower(pixels.transpose(0, 2, 3, 1),
                                                 output_hidden_states=True)
        picked = [states[i] for i in self.layers]
        if self.strategy == "default":
            picked = [s[:, 1:] for s in picked]
        return self.modules.multi_modal_projector(mx.concatenate(picked, axis=-1))[0]


class QwenVLTower(VisionTower):
    """Qwen2-VL / Qwen2.5-VL: a ViT over the processor's flattened patches (windowed
    attention in 2.5) and a 2x2 patch merger. Item: pixel_values [patches, C*T*P*P]
    and image_grid_thw [3] -> [patches / merge^2, text_hidden]."""

    def _build(self, config: dict) -> nn.Module:
        import importlib

        family = importlib.import_module(f"mlx_vlm.models.{config['model_type']}")
        # transformers 5 names the sub-config "<model_type>_vision"; mlx-vlm wants the
        # model's own type there.
        vision = family.config.VisionConfig.from_dict(
            {**config["vision_config"], "model_type": config["model_type"]})
        modules = nn.Module()
        modules.vision_tower = family.vision.VisionModel(vision)
        return modules

    def _sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        renamed = {("vision_tower." + k.removeprefix("visual.") if k.startswith("visual.")
                    else k): v for k, v in weights.items()}
        return self.modules.vision_tower.sanitize(renamed)

    def _encode_one(self, item: dict[str, torch.Tensor]) -> mx.array:
        grid = mx.array(_numpy(item["image_grid_thw"]).reshape(1, 3).astype(np.int32))
        return self.modules.vision_tower(_to_mx(item["pixel_values"], self.dtype), grid)


class Gemma3Tower(VisionTower):
    """Gemma 3: a SigLIP tower whose patches are average-pooled to
    ``mm_tokens_per_image``, RMS-normed and projected. Item: pixel_values
    [crops, 3, H, W] (one crop, more with pan-and-scan) -> [crops x
    mm_tokens_per_image, text_hidden].

    The rows come out divided by the factor mlx-lm's Gemma 3 multiplies its input
    embeddings by (sqrt(hidden), rounded to bfloat16 as it rounds it): it scales
    whatever it is given, and image rows must reach the first layer as the
    projector made them (transformers and vLLM merge them unscaled).
    """

    def _build(self, config: dict) -> nn.Module:
        from mlx_vlm.models.gemma3.config import ModelConfig, TextConfig, VisionConfig
        from mlx_vlm.models.gemma3.gemma3 import Gemma3MultiModalProjector
        from mlx_vlm.models.gemma3.vision import VisionModel

        vision = VisionConfig.from_dict({**config["vision_config"], "model_type": "gemma3"})
        text_dict = config["text_config"]
        # The pooling reads the token count from the text config; checkpoints keep it
        # at the top level.
        text = TextConfig.from_dict({**text_dict, "model_type": "gemma3_text",
                                     "mm_tokens_per_image": config.get("mm_tokens_per_image", 256)})
        cfg = ModelConfig(text_config=text, vision_config=vision, model_type="gemma3")
        modules = nn.Module()
        modules.vision_tower = VisionModel(vision)
        modules.multi_modal_projector = Gemma3MultiModalProjector(cfg)
        # mlx-vlm builds SigLIP's last LayerNorm with MLX's default epsilon.
        modules.vision_tower.vision_model.post_layernorm.eps = vision.layer_norm_eps
        self.input_scale = float(mx.array(text.hidden_size**0.5, mx.bfloat16).item())
        return modules

    def _sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        return self.modules.vision_tower.sanitize(_nested_vision_model(weights))

    def _encode_one(self, item: dict[str, torch.Tensor]) -> mx.array:
        pixels = _to_mx(item["pixel_values"], self.dtype)
        if pixels.ndim == 3:
            pixels = pixels[None]
        states, _, _ = self.modules.vision_tower(pixels.transpose(0, 2, 3, 1))
        rows = self.modules.multi_modal_projector(states)
        return (rows.reshape(-1, rows.shape[-1]).astype(mx.float32)
                / self.input_scale).astype(self.dtype)


class Qwen3VLTower(QwenVLTower):
    """Qwen3-VL: Qwen's ViT with learned position embeddings and "deepstack" mergers
    that take the patches after some of its blocks. Item as QwenVLTower's ->
    [patches / merge^2, text_hidden x (1 + deepstack_levels)]: the merged rows, then
    each level's rows, which the language model adds to the image's hidden states
    after its first ``deepstack_levels`` layers (models.deepstack); vLLM's
    ``embed_multimodal`` lays them out the same way."""

    @property
    def deepstack_levels(self) -> int:
        return len(self.modules.vision_tower.deepstack_visual_indexes)

    def _encode_one(self, item: dict[str, torch.Tensor]) -> mx.array:
        grid = mx.array(_numpy(item["image_grid_thw"]).reshape(1, 3).astype(np.int32))
        rows, levels = self.modules.vision_tower(_to_mx(item["pixel_values"], self.dtype),
                                                 grid)
        return mx.concatenate([rows, *levels], axis=-1)


# model_type -> its tower.
TOWERS: dict[str, type[VisionTower]] = {"llava": LlavaTower, "qwen2_vl": QwenVLTower,
                                        "qwen2_5_vl": QwenVLTower, "gemma3": Gemma3Tower,
                                        "qwen3_vl": Qwen3VLTower}


def vision_model_type(config: dict) -> str | None:
    """The ``model_type`` of a checkpoint config whose images this module encodes."""
    kind = config.get("model_type")
    return kind if kind in TOWERS else None


def lacks_tower_weights(path: str | Path, config: dict) -> bool:
    """A checkpoint of a served VLM type whose files hold no vision weights (mlx-lm's
    conversions keep the multimodal config but drop the tower): it is served as a
    language model. Reads only the safetensors headers."""
    from safetensors import safe_open

    path = Path(path)
    if vision_model_type(config) is None or not path.is_dir():
        return False
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), "numpy") as f:
            if any(k.startswith(_PREFIXES) for k in f.keys()):
                return False
    return True


def load_vision_tower(path: str | Path, dtype: mx.Dtype, backend: Backend
                      ) -> VisionTower | None:
    """The tower of the checkpoint at ``path`` (None: not a served VLM)."""
    path = Path(path)
    config = json.loads((path / "config.json").read_text())
    kind = vision_model_type(config)
    if kind is None:
        return None
    return TOWERS[kind](config, _vision_weights(path), dtype, backend)


@contextlib.contextmanager
def _processors_untouched():
    """Importing an mlx-vlm model module replaces transformers'
    ``AutoProcessor.from_pretrained`` process-wide with mlx-vlm's own processors
    (numpy outputs, its own resizing): vLLM's front end in the same process (an
    offline ``LLM``) would then prepare images differently. Put it back."""
    from transformers import AutoProcessor

    before = AutoProcessor.__dict__["from_pretrained"]
    try:
        yield
    finally:
        AutoProcessor.from_pretrained = before


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


def _nested_vision_model(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """Hub checkpoints nest a CLIP/SigLIP tower's keys under ``vision_model``;
    transformers 5 saves them without it."""
    nested = {}
    for key, value in weights.items():
        if key.startswith("vision_tower.") and not key.startswith("vision_tower.vision_model."):
            key = "vision_tower.vision_model." + key.removeprefix("vision_tower.")
        nested[key] = value
    return nested


def _numpy(tensor: torch.Tensor | np.ndarray) -> np.ndarray:
    """float32 for floating tensors (numpy has no bfloat16)."""
    if isinstance(tensor, np.ndarray):
        return tensor
    return (tensor.detach().float() if tensor.is_floating_point() else tensor.detach()).numpy()


def _to_mx(tensor: torch.Tensor, dtype: mx.Dtype) -> mx.array:
    return mx.array(_numpy(tensor).astype(np.float32)).astype(dtype)


def _given_embeds(item: dict[str, Any], dtype: mx.Dtype) -> mx.array:
    return _to_mx(item["image_embeds"], dtype)
