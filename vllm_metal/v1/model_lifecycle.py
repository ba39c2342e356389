"""Load an MLX model for vLLM and derive the dimensions the KV cache needs."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from vllm_metal import envs
from vllm_metal.attention.context import get_forward_context
from vllm_metal.models.adapter import ModelAdapter, UnsupportedModelError
from vllm_metal.models.cpu_fast_functions import cpu_fast_functions
from vllm_metal.models.cpu_fast_path import use_fast_cpu_linears
from vllm_metal.models.decoder_stack import DecoderStackPlan, plan_decoder_stack
from vllm_metal.v1.huge_pages import array_ranges, back_with_huge_pages

logger = logging.getLogger("vllm_metal")


@dataclass(frozen=True)
class ModelDims:
    num_layers: int     # KV entries (layers that share K/V count once)
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int


@dataclass
class LoadedModel:
    model: nn.Module
    adapter: ModelAdapter
    dims: ModelDims
    dtype: mx.Dtype
    # MLX computes on the CPU: build norms and RoPE as our single-node kernels.
    cpu_fast: bool = False
    # The whole layer stack as one CPU node (None: module by module).
    stack: DecoderStackPlan | None = None

    def backbone(self, input_ids: mx.array) -> mx.array:
        """input_ids int32 [1, total_q] -> final hidden states [1, total_q, hidden]."""
        if self.stack is not None:
            ctx = get_forward_context()
            x = self.adapter.backbone.embed_tokens(input_ids)
            if self.stack.accepts(x, ctx):
                return self.stack(x, ctx)
        with cpu_fast_functions(self.cpu_fast):
            return self.adapter.hidden(input_ids[0])[None]

    def logits(self, hidden: mx.array) -> mx.array:
        """hidden [R, hidden] -> logits [R, vocab] (the family's own head)."""
        return self.adapter.logits(hidden)

    def greedy_tokens(self, hidden: mx.array, vocab_size: int) -> mx.array | None:
        """hidden [R, hidden] -> int32 [R], argmax of ``logits(hidden)[:, :vocab_size]`` in
        one node that never writes the logits out; None where the head has no such op
        (not a CPU quantized head, a head the family transforms after, or activations
        other than float32)."""
        if self.adapter.plain_head is None:
            return None
        head, _ = self.adapter.plain_head
        greedy = getattr(head, "greedy", None)
        if greedy is None or hidden.dtype != mx.float32 or vocab_size > head["weight"].shape[0]:
            return None   # the sampler's path (and its errors) apply
        if head.get("bias") is not None and head["bias"].dtype != mx.float32:
            return None
        return greedy(hidden, vocab_size)


def load_model(model_path: str, dtype: mx.Dtype) -> LoadedModel:
    """Load a local HF-format model directory (float or MLX-quantized) with mlx-lm.

    Floating parameters (including quantization scales/biases) are cast to ``dtype``;
    attention modules are swapped for paged wrappers.
    """
    model = _load_mlx_model(model_path, dtype)
    # MLX's CPU matmuls are scalar and single-threaded; ours read weights at
    # memory speed. No-op on Metal, where MLX's own kernels stay.
    int8 = envs.VLLM_METAL_CPU_INT8_ACTIVATIONS
    fast_linears = use_fast_cpu_linears(model, activation_dtype=mx.float32 if int8 else None,
                                        int8_activations=int8)
    mx.eval(model.parameters())
    adapter = ModelAdapter(model)
    dims = derive_dims(adapter)
    cpu = mx.default_device().type == mx.cpu
    if not cpu:
        _check_metal_head_size(adapter.family, dims.head_dim)
    if cpu and envs.VLLM_METAL_CPU_HUGE_PAGES:
        _weights_on_huge_pages(model)
    stack = None
    if cpu and fast_linears and envs.VLLM_METAL_CPU_DECODER_STACK:
        stack = plan_decoder_stack(adapter, int8_activations=int8)
    logger.info("Loaded %s: %d layers, %d/%d heads, head_dim %d, %s, %.1f MiB, "
                "%d linear/embedding layers on the fast CPU path%s%s",
                adapter.family, dims.num_layers, dims.num_heads,
                dims.num_kv_heads, dims.head_dim, dtype, parameter_bytes(model) / 2**20,
                fast_linears, ", decoder stack as one CPU node" if stack else "",
                ", int8 activations" if int8 and fast_linears else "")
    return LoadedModel(model, adapter, dims, dtype, cpu_fast=cpu, stack=stack)


def _weights_on_huge_pages(model: nn.Module) -> None:
    start = time.perf_counter()
    report = back_with_huge_pages(array_ranges(a for _, a in tree_flatten(model.parameters())))
    logger.info("Weights on huge pages: %.1f of %.1f MiB (%.1f MiB collapsed in %.2f s)%s",
                report.weights_collapsed / 2**20, report.weight_bytes / 2**20,
                report.collapsed_bytes / 2**20, time.perf_counter() - start,
                f"; refused: {', '.join(sorted(set(report.errors)))}" if report.errors else "")


def _load_mlx_model(model_path: str, dtype: mx.Dtype) -> nn.Module:
    """A GGUF file through our GGUF loader; an HF-format directory through mlx-lm."""
    from vllm_metal.gguf_plugin import gguf_model_file

    gguf = gguf_model_file(model_path)
    if gguf is not None:
        from vllm_metal.gguf.loader import load_gguf_model

        return load_gguf_model(gguf, dtype)[0]
    from mlx_lm.utils import load_model as mlx_lm_load_model

    path = Path(model_path)
    if not path.is_dir():
        raise ValueError(
            f"model path {model_path!r} is neither a local model directory nor a .gguf "
            "file; vllm-metal loads models from disk (download it first, e.g. with "
            "`hf download`)")
    model, _config = mlx_lm_load_model(path, lazy=True)
    model.set_dtype(dtype)
    return model


def derive_dims(adapter: ModelAdapter) -> ModelDims:
    """The paged cache's dimensions; refused when KV entries differ in shape."""
    shapes = {(e.num_kv_heads, e.head_dim) for e in adapter.entries}
    if len(shapes) != 1:
        raise UnsupportedModelError(
            f"{adapter.family}: its layers differ in (KV heads, head size) {sorted(shapes)}; "
            "vllm-metal's paged cache needs one shape for all layers")
    (num_kv_heads, head_dim), = shapes
    num_heads = max(e.num_heads for e in adapter.entries)
    return ModelDims(len(adapter.entries), num_heads, num_kv_heads, head_dim,
                     adapter.vocab_size)


def _check_metal_head_size(family: str, head_dim: int) -> None:
    """The Metal kernels are instantiated for a fixed set of head sizes."""
    from vllm_metal.native import get_ops

    sizes = get_ops().metal_head_sizes()
    if head_dim not in sizes:
        raise UnsupportedModelError(
            f"{family}: head size {head_dim} has no Metal paged-attention kernel "
            f"(instantiated for {', '.join(map(str, sizes))})")


def parameter_bytes(model: nn.Module) -> int:
    return sum(p.nbytes for _, p in tree_flatten(model.parameters()))
