"""MetalBackend: MLX on the Apple GPU, where vllm-metal adds only the paged ops."""

from __future__ import annotations

from typing import TYPE_CHECKING

import mlx.core as mx

from vllm_metal.backend import Backend, system_memory_bytes

if TYPE_CHECKING:
    import mlx.nn as nn
    import torch

    from vllm_metal.attention.caches.paged_kv_cache import PagedKVCache
    from vllm_metal.models.adapter import ModelAdapter
    from vllm_metal.v1.model_lifecycle import ModelDims


class MetalBackbone:
    """The family's mlx-lm backbone, module by module on MLX's GPU kernels."""

    summary = "Metal GPU"

    def __init__(self, adapter: ModelAdapter) -> None:
        self.adapter = adapter

    def __call__(self, input_ids: mx.array, embeddings: mx.array | None = None) -> mx.array:
        """input_ids int32 [1, total_q] -> hidden [1, total_q, hidden] (see Backbone)."""
        return self.adapter.hidden(input_ids[0], embeddings)[None]

    def modules_only(self, why: str) -> None:
        pass   # it always does


class MetalBackend(Backend):
    label = "Metal"
    device = mx.gpu
    # Gumbel-max and argpartition run well on the GPU; the CPU kernels would
    # pull the logits to the CPU stream.
    sampling_kernels = False
    # The Metal kernels split a key row's dimensions across a simdgroup's lanes.
    key_columns = False

    def device_memory_bytes(self) -> int:
        # Metal's recommended working set: what the GPU may keep resident.
        size = mx.device_info().get("max_recommended_working_set_size")
        return int(size) if size else system_memory_bytes()

    def supported_dtypes(self) -> list[torch.dtype]:
        import torch

        return [torch.float16, torch.bfloat16, torch.float32]

    def quiet_threads(self) -> None:
        return None  # the GPU computes: idle host threads take nothing from it

    def kv_cache_cap(self) -> int | None:
        return None

    def prepare_weights(self, model: nn.Module) -> None:
        return None  # MLX's own kernels take every layer

    def prepare_backbone(self, model: nn.Module, adapter: ModelAdapter,
                         dims: ModelDims) -> MetalBackbone:
        check_head_size(adapter.family, dims.head_dim)
        return MetalBackbone(adapter)

    def kv_cache_dtype(self, model: nn.Module) -> mx.Dtype | None:
        return None

    def commit_kv_cache(self, cache: PagedKVCache) -> int:
        return 0  # the zero fill is a GPU kernel that writes (commits) every page


def check_head_size(family: str, head_dim: int) -> None:
    """The Metal kernels are instantiated for a fixed set of head sizes."""
    from vllm_metal.models.adapter import UnsupportedModelError
    from vllm_metal.native import get_ops

    sizes = get_ops().metal_head_sizes()
    if head_dim not in sizes:
        raise UnsupportedModelError(
            f"{family}: head size {head_dim} has no Metal paged-attention kernel "
            f"(instantiated for {', '.join(map(str, sizes))})")

