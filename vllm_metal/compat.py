"""Idempotent patches for version skew between vLLM, torch and this plugin.

Each patch states why it exists and when it can go. ``apply_all()`` runs them
once per process (the platform calls it when vLLM first asks for it).
"""

from __future__ import annotations

import logging

logger = logging.getLogger("vllm_metal")

_applied: set[str] = set()


def _once(name: str) -> bool:
    if name in _applied:
        return False
    _applied.add(name)
    return True


def patch_accelerator_cache_calls() -> None:
    """Make ``torch.accelerator.empty_cache``/``empty_host_cache`` no-ops without a device.

    Why: vLLM 0.33's ``cleanup_dist_env_and_memory`` calls them whenever the
    platform is not ``is_cpu()``; on CPU-only torch they raise "Cannot access
    accelerator device when none is available", which breaks shutdown.
    Remove when vLLM guards those calls with ``torch.accelerator.is_available()``.
    """
    if not _once("accelerator_cache"):
        return
    import torch

    accel = getattr(torch, "accelerator", None)
    if accel is None or accel.is_available():
        return
    for name in ("empty_cache", "empty_host_cache"):
        if hasattr(accel, name):
            setattr(accel, name, lambda *args, **kwargs: None)


def apply_all() -> None:
    patch_accelerator_cache_calls()
