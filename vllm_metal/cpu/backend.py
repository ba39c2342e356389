"""CpuBackend: MLX on the host's CPU, with the model on the extension's CPU kernels."""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import mlx.core as mx

from vllm_metal import envs
from vllm_metal.backend import Backend, system_memory_bytes
from vllm_metal.distributed.pipeline import StageLink, link_of

if TYPE_CHECKING:
    import mlx.nn as nn
    import torch

    from vllm_metal.attention.caches.paged_kv_cache import PagedKVCache
    from vllm_metal.cpu.decoder_stack import DecoderStackPlan
    from vllm_metal.models.adapter import ModelAdapter
    from vllm_metal.v1.model_lifecycle import ModelDims

logger = logging.getLogger("vllm_metal")


@dataclass
class CpuBackbone:
    """The backbone as one decoder-stack node when the stack takes the step, else
    module by module with norms and RoPE built as single CPU nodes."""

    adapter: ModelAdapter
    stack: DecoderStackPlan | None   # None: the module path only
    summary: str
    # A pipeline stage's link to its neighbours (found once, not per step).
    link: StageLink | None = None

    def __post_init__(self) -> None:
        if self.adapter.stage is not None:
            self.link = link_of(self.adapter.backbone.layers)

    def __call__(self, input_ids: mx.array, embeddings: mx.array | None = None) -> mx.array:
        """input_ids int32 [1, total_q] -> hidden [1, total_q, hidden] (see Backbone)."""
        from vllm_metal.attention.context import get_forward_context
        from vllm_metal.cpu.fast_functions import fast_functions

        if self.stack is not None:
            ctx = get_forward_context()
            x, embedded = self._stack_input(input_ids, embeddings)
            if self.stack.accepts(x, ctx):
                out = self.stack(x, ctx, embedded)
                stage = self.adapter.stage
                if stage is not None and not stage.is_last:
                    self.link.outgoing = out
                return out
        with fast_functions():
            return self.adapter.hidden(input_ids[0], embeddings)[None]

    def modules_only(self, why: str) -> None:
        # Every step, not only those the change touches: a request's output must not
        # depend on which path its batch took.
        if self.stack is not None:
            logger.info("Decoder stack off, every step runs module by module: %s", why)
            self.stack = None

    def _stack_input(self, input_ids: mx.array, embeddings: mx.array | None
                     ) -> tuple[mx.array, bool]:
        """(the stack's input [1, T, hidden], whether it is the embeddings): a pipeline
        stage after the first starts from what the previous stage sent (a step that
        receives nothing, the memory profile, from the embeddings as the module path
        does)."""
        stage = self.adapter.stage
        if stage is not None and stage.start > 0:
            got = self.link.incoming
            if got is not None:
                return got.reshape(1, -1, got.shape[-1]), False
        if embeddings is not None:
            return embeddings[None], True
        return self.adapter.backbone.embed_tokens(input_ids), True


class CpuBackend(Backend):
    label = "MLX CPU"
    device = mx.cpu
    # One kernel draws with temperature, min-p, top-k and top-p (docs/architecture.md,
    # "One engine step"): MLX's CPU backend runs Gumbel-max in scalar nodes.
    sampling_kernels = True
    # The CPU attention kernel scores a vector of keys per load from key columns,
    # with no lane reduction per key (docs/architecture.md, "KV cache and memory").
    key_columns = True

    def device_memory_bytes(self) -> int:
        return system_memory_bytes()

    def supported_dtypes(self) -> list[torch.dtype]:
        import torch

        # MLX's Linux CPU backend runs half precision 10-40x slower than float32
        # (scalar kernels), so there auto means float32; an explicit --dtype still wins.
        if sys.platform == "darwin":
            return [torch.float16, torch.bfloat16, torch.float32]
        return [torch.float32]

    def quiet_threads(self) -> None:
        from vllm_metal.cpu.idle_threads import deprioritize_threads

        deprioritize_threads()  # gloo's idle loop threads

    def kv_cache_cap(self) -> int | None:
        from vllm_metal.cpu.kv_cap import kv_cache_cap

        return kv_cache_cap()

    def prepare_weights(self, model: nn.Module) -> None:
        # MLX's CPU matmuls are scalar and single-threaded; ours read weights at
        # memory speed. The layers compute in float32 until prepare_backbone: the
        # adapter's checks hold its wrappers to the modules' own forward, exactly.
        self._use_fast_linears(model, int8=False)

    def _use_fast_linears(self, model: nn.Module, int8: bool) -> None:
        from vllm_metal.cpu.fast_linears import use_fast_cpu_linears

        fp32 = _int8_activations(model)  # int8 computes on fp32 activations
        use_fast_cpu_linears(model, activation_dtype=mx.float32 if fp32 else None,
                             int8_activations=int8 and fp32)

    def prepare_backbone(self, model: nn.Module, adapter: ModelAdapter,
                         dims: ModelDims) -> CpuBackbone:
        from vllm_metal.cpu.decoder_stack import plan_decoder_stack
        from vllm_metal.cpu.fast_linears import count_fast_modules, runs_int8, tile_int8_weights

        # Again (it is idempotent): the adapter's wrappers made modules of their own
        # (LatentAttention's per-head projections); int8 from here on.
        self._use_fast_linears(model, int8=True)
        fast = count_fast_modules(model)
        int8 = runs_int8(model)
        stack = None
        if fast and envs.VLLM_METAL_CPU_DECODER_STACK:
            # Probes in MLX's layout, then tiles the layers it runs (int8).
            stack = plan_decoder_stack(adapter, int8_activations=int8)
        if int8:
            tile_int8_weights(model)  # the rest: the head, and every layer without a stack
        if envs.VLLM_METAL_CPU_HUGE_PAGES:
            _weights_on_huge_pages(model)  # the arrays that stay
        summary = (f"{fast} linear/embedding/expert layers on the fast CPU path"
                   f"{', decoder stack as one CPU node' if stack else ''}"
                   f"{', int8 activations' if int8 and fast else ''}")
        return CpuBackbone(adapter, stack, summary)

    @contextlib.contextmanager
    def encoder_context(self):
        from vllm_metal.cpu.fast_activations import fast_activations
        from vllm_metal.cpu.full_attention import full_attention

        # MLX's CPU attention is scalar and single-threaded; so are its erf/tanh/exp.
        with full_attention(), fast_activations():
            yield

    def kv_cache_dtype(self, model: nn.Module) -> mx.Dtype | None:
        # Half precision may halve an fp32 model's cache (vLLM's own
        # --kv-cache-dtype must equal the model's dtype). With int8 activations
        # the model already trades exactness for speed, and fp16 halves the bytes
        # attention reads per step: the fast path takes both.
        from vllm_metal.cpu.fast_linears import runs_int8

        name = envs.VLLM_METAL_CPU_KV_CACHE_DTYPE
        if name == "auto":
            return mx.float16 if runs_int8(model) else None
        return getattr(mx, name)

    def commit_kv_cache(self, cache: PagedKVCache) -> int:
        from vllm_metal.cpu.huge_pages import array_ranges, zeros_on_huge_pages
        from vllm_metal.v1.memory_budget import InsufficientMemoryError

        if not envs.VLLM_METAL_CPU_HUGE_PAGES:
            return 0
        try:
            return zeros_on_huge_pages(array_ranges(cache.buffers()))
        except MemoryError as e:
            raise InsufficientMemoryError(
                f"The {cache.nbytes / 2**30:.2f} GiB KV cache does not fit in "
                f"this host's free memory ({e}). Lower VLLM_METAL_CPU_KV_CACHE_GIB, "
                "--kv-cache-memory or --gpu-memory-utilization.") from e


def _int8_activations(model: nn.Module) -> bool:
    """VLLM_METAL_CPU_INT8_ACTIVATIONS: on or off, or (auto) on when the model has
    quantized layers the int8 kernels take: a quantized checkpoint is already an
    approximation, and int8 makes it 1.5-3x faster; float checkpoints stay exact."""
    from vllm_metal.cpu.fast_linears import int8_capable

    setting = envs.VLLM_METAL_CPU_INT8_ACTIVATIONS
    return int8_capable(model) if setting is None else setting


def _weights_on_huge_pages(model: nn.Module) -> None:
    from mlx.utils import tree_flatten

    from vllm_metal.cpu.huge_pages import array_ranges, back_with_huge_pages

    start = time.perf_counter()
    report = back_with_huge_pages(array_ranges(a for _, a in tree_flatten(model.parameters())))
    logger.info("Weights on huge pages: %.1f of %.1f MiB (%.1f MiB collapsed in %.2f s)%s",
                report.weights_collapsed / 2**20, report.weight_bytes / 2**20,
                report.collapsed_bytes / 2**20, time.perf_counter() - start,
                f"; refused: {', '.join(sorted(set(report.errors)))}" if report.errors else "")
