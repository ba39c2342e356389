"""The seam between the shared engine and its two compute backends.

The control plane, the runner's step, the model adaptation and the ops are
shared. What differs between MLX on a Metal GPU and MLX on the CPU lives in one
wing per backend (``vllm_metal/metal/``, ``vllm_metal/cpu/``) behind a
``Backend``. ``select_backend`` is the one place that asks which: the worker
calls it once when it sets up its device and hands the object to the model's
load and to the runner; the platform asks it for the device's facts.
"""

from __future__ import annotations

import contextlib
import os
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar, Protocol

import mlx.core as mx

if TYPE_CHECKING:
    import mlx.nn as nn
    import torch

    from vllm_metal.attention.caches.paged_kv_cache import PagedKVCache
    from vllm_metal.models.adapter import ModelAdapter
    from vllm_metal.v1.model_lifecycle import ModelDims


class Backbone(Protocol):
    """A loaded model's backbone as its backend runs it (one per model)."""

    summary: str  # how the backend runs it, for the load log

    def __call__(self, input_ids: mx.array, embeddings: mx.array | None = None) -> mx.array:
        """input_ids int32 [1, total_q] -> final hidden states [1, total_q, hidden],
        inside the runner's forward_context. embeddings [total_q, hidden]: the
        backbone's input in place of the token embeddings (a multimodal step's merged
        rows), before any embedding scale the family applies."""

    def modules_only(self, why: str) -> None:
        """From now on run every step module by module (the runner changed the
        modules after load: ``why`` says how)."""


class Backend(ABC):
    """Where MLX computes, and what vllm-metal adds there.

    Hooks by caller: the worker and platform (the process), the model's load
    (``prepare_weights`` before the weights are evaluated, ``prepare_backbone``
    after the adapter probed the model), the runner (the KV cache, the sampler).
    """

    label: ClassVar[str]            # e.g. "Metal", for device names and logs
    device: ClassVar[mx.DeviceType]
    # The sampler picks tokens with the CPU kernels (ops.sampling) instead of MLX
    # ops and Gumbel-max.
    sampling_kernels: ClassVar[bool]
    # Float KV caches keep each page's keys as columns where the attention ops
    # take them so (ops.paged_attention's key_columns; PagedKVCache decides per
    # cache).
    key_columns: ClassVar[bool]

    # -- the process: worker and platform -----------------------------------

    def init_device(self) -> None:
        """Make this backend's device MLX's default (once, in the worker)."""
        mx.set_default_device(self.device)

    @abstractmethod
    def device_memory_bytes(self) -> int:
        """Memory the device may use, in bytes."""

    @abstractmethod
    def supported_dtypes(self) -> list[torch.dtype]:
        """The dtypes ``--dtype auto`` picks from, preferred first."""

    @abstractmethod
    def quiet_threads(self) -> None:
        """After vLLM's process groups exist: keep their idle threads off the compute."""

    @abstractmethod
    def kv_cache_cap(self) -> int | None:
        """The most KV cache bytes the budget may give (None: the budget decides)."""

    # -- the model: model_lifecycle.load_model ------------------------------

    @abstractmethod
    def prepare_weights(self, model: nn.Module) -> None:
        """Before the weights are evaluated: put the model's layers on this backend's kernels."""

    @abstractmethod
    def prepare_backbone(self, model: nn.Module, adapter: ModelAdapter,
                         dims: ModelDims) -> Backbone:
        """After the adapter probed the model: refuse what this backend cannot run
        (UnsupportedModelError), place the weights, plan the step's forward."""

    def encoder_context(self) -> contextlib.AbstractContextManager:
        """Around an encoder's forward (a vision tower's): this backend's kernels
        for what MLX runs slowly here."""
        return contextlib.nullcontext()

    # -- the KV cache: the runner -------------------------------------------

    @abstractmethod
    def kv_cache_dtype(self, model: nn.Module) -> mx.Dtype | None:
        """The cache's dtype when vLLM's --kv-cache-dtype is auto, for the prepared
        ``model`` (None: the model's dtype)."""

    @abstractmethod
    def commit_kv_cache(self, cache: PagedKVCache) -> int:
        """Commit the freshly zeroed cache's memory now; returns the bytes moved onto
        huge pages."""


def select_backend() -> Backend:
    """Metal when MLX has a Metal device, else the CPU backend (the one place that asks)."""
    if mx.metal.is_available():
        from vllm_metal.metal.backend import MetalBackend

        return MetalBackend()
    from vllm_metal.cpu.backend import CpuBackend

    return CpuBackend()


def system_memory_bytes() -> int:
    """Physical memory of the host in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
