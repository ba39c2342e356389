"""Multimodal rotary positions (M-RoPE) of Qwen2-VL-class language models.

Each token has three positions (time, height, width): text tokens have all three
equal, an image's tokens take their patch's row and column, and the text after an
image continues from the largest position so far plus one. Each rotary frequency
reads one of the three, by sections of the frequency axis (``mrope_section``:
consecutive chunks, or interleaved T H W T H W ... in Qwen3-VL).

mlx-lm's language models for these checkpoints rotate with one position per token,
which is right for text rows only. Here the per-request positions come from vLLM's
own model class (``get_mrope_input_positions``, the function vLLM's GPU runner calls),
each step gets them per packed row (``RequestRopePositions.of_step``), their angles
are formed once on the host (``RopeAngles``), and ``SectionedRope``
replaces each attention's rotary module to read them. Rows past the prompt (decode)
are at ``position + delta`` on all three axes, as vLLM does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from vllm_metal.attention.context import get_forward_context, in_forward

if TYPE_CHECKING:
    from vllm.config import ModelConfig

    from vllm_metal.v1.input_batch import StepInputs


def mrope_sections(hf_config) -> tuple[list[int], bool] | None:
    """(mrope_section, interleaved) of a checkpoint's text model; None without M-RoPE."""
    text = hf_config.get_text_config()
    for name in ("rope_parameters", "rope_scaling"):
        params = getattr(text, name, None) or {}
        if params.get("mrope_section"):
            return list(params["mrope_section"]), bool(params.get("mrope_interleaved", False))
    return None


class RequestRopePositions:
    """Each live request's M-RoPE positions: prompt int32 [3, prompt_len], and the
    delta that places its later tokens."""

    def __init__(self, model_config: ModelConfig) -> None:
        from vllm.model_executor.models import ModelRegistry

        cls, _ = ModelRegistry.resolve_model_cls(model_config.architectures,
                                                 model_config=model_config)
        # vLLM's method reads only the model's config and the class's own helpers: an
        # instance made without __init__ holds the config, so no torch model is built.
        self._model = object.__new__(cls)
        object.__setattr__(self._model, "config", model_config.hf_config)
        self.prompt: dict[str, np.ndarray] = {}
        self.delta: dict[str, int] = {}

    def add(self, req_id: str, prompt_ids: list[int], mm_features: list) -> None:
        if not mm_features:
            return   # text only: the plain positions (delta 0)
        positions, delta = self._model.get_mrope_input_positions(prompt_ids, mm_features)
        self.prompt[req_id] = np.asarray(positions, dtype=np.int32).reshape(3, -1)
        self.delta[req_id] = int(delta)

    def remove(self, req_id: str) -> None:
        self.prompt.pop(req_id, None)
        self.delta.pop(req_id, None)

    def of_step(self, step: StepInputs) -> np.ndarray:
        """int32 [3, total_q]: the three positions of each packed row."""
        out = np.broadcast_to(step.positions, (3, len(step.positions))).copy()
        for i, req_id in enumerate(step.req_ids):
            lo, hi = int(step.cu_seqlens_q[i]), int(step.cu_seqlens_q[i + 1])
            out[:, lo:hi] += self.delta.get(req_id, 0)
            prompt = self.prompt.get(req_id)
            if prompt is not None:
                pos = step.positions[lo:hi]
                inside = pos < prompt.shape[1]
                out[:, lo:hi][:, inside] = prompt[:, pos[inside]]
        return out


class RopeAngles:
    """Each row's rotary angles under M-RoPE, on the host in float64 (MLX's CPU
    cos/sin round an element differently by where it falls in the vector loop, so a
    row's rotation would depend on how many rows the step has)."""

    def __init__(self, dims: int, base: float, sections: list[int], interleaved: bool) -> None:
        half = dims // 2
        if sum(sections) != half:
            raise ValueError(f"mrope_section {sections} does not cover {half} frequencies")
        channels = np.arange(half)
        if interleaved:
            axis = np.zeros(half, np.int64)
            axis[(channels % 3 == 1) & (channels < 3 * sections[1])] = 1
            axis[(channels % 3 == 2) & (channels < 3 * sections[2])] = 2
        else:
            axis = np.repeat(np.arange(3), sections)
        self.axis = axis
        self.inv_freq = base ** (-np.arange(0, dims, 2, dtype=np.float64) / dims)

    def table(self, grid: np.ndarray) -> np.ndarray:
        """grid int [3, rows] (time, height, width) -> float32 [2, rows, half]: cos, sin."""
        angles = grid[self.axis].T.astype(np.float64) * self.inv_freq
        return np.stack([np.cos(angles), np.sin(angles)]).astype(np.float32)


class SectionedRope(nn.Module):
    """A layer's rotary module under M-RoPE: rotates each row by the forward's
    ``metadata.rope_angles`` (RopeAngles.table of its three positions); without them
    (a forward outside vLLM's schedule: profiling) the family's own module."""

    def __init__(self, rope: nn.Module) -> None:
        super().__init__()
        if rope.traditional or getattr(rope, "scale", 1.0) != 1.0:
            raise ValueError("M-RoPE over a traditional or scaled rotary module")
        self.rope = rope
        self.dims = int(rope.dims)
        self.freeze()

    def __call__(self, x: mx.array, offset=0) -> mx.array:
        """x [rows, heads, 1, head_dim] (the packed step's rows)."""
        meta = get_forward_context().metadata if in_forward() else None
        if meta is None or meta.rope_angles is None:
            return self.rope(x, offset=offset)
        cos = meta.rope_angles[0][:, None, None, :].astype(x.dtype)
        sin = meta.rope_angles[1][:, None, None, :].astype(x.dtype)
        half = self.dims // 2
        x1, x2, rest = x[..., :half], x[..., half:self.dims], x[..., self.dims:]
        return mx.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], axis=-1)


def use_sectioned_rope(model: nn.Module, sections: list[int], interleaved: bool
                       ) -> RopeAngles:
    """Replace every attention's ``rope`` under ``model`` by a SectionedRope; returns
    the angles they all take (one rotary spec: the decoder stack passes one table)."""
    owners = [m for _, m in model.named_modules()
              if isinstance(getattr(m, "rope", None), nn.Module) and hasattr(m.rope, "base")]
    specs = {(int(m.rope.dims), float(m.rope.base)) for m in owners}
    if len(specs) != 1:
        raise ValueError(f"M-RoPE over {len(specs)} rotary specs (dims, base): {sorted(specs)}")
    for module in owners:
        module.rope = SectionedRope(module.rope)
    return RopeAngles(*specs.pop(), sections, interleaved)
