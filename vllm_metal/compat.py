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


class _FirstOnly(logging.Filter):
    """Lets through the first record whose message starts with ``prefix``."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix
        self.seen = False

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(self.prefix):
            return True
        first, self.seen = not self.seen, True
        return first


def quiet_audio_backend_warning() -> None:
    """Log vLLM's "torchcodec unavailable ... falling back to soundfile/PyAV" once per
    process instead of once per decoded clip.

    Why: vLLM 0.33's ``load_audio`` tries torchcodec first on every call and warns
    when it is missing; torchcodec needs a system FFmpeg, which a Mac (or this
    plugin's install) need not have, while soundfile and PyAV (installed) decode the
    clip. A transcription server would log it with every request. Remove when vLLM
    warns once.
    """
    if not _once("audio_backend_warning"):
        return
    logging.getLogger("vllm.multimodal.media.audio").addFilter(
        _FirstOnly("torchcodec unavailable"))


def apply_all() -> None:
    patch_accelerator_cache_calls()
    quiet_audio_backend_warning()
