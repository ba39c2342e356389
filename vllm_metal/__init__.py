"""vllm-metal: a vLLM platform plugin that runs models through MLX.

vLLM calls :func:`register` (entry point ``vllm.platform_plugins``) in every
process to ask whether this plugin should drive the machine.
"""

from __future__ import annotations

import logging
import os
import sys

__version__ = "0.1.0"

PLATFORM_QUALNAME = "vllm_metal.platform.MetalPlatform"

# Accelerator platforms that outrank us on Linux when they claim the machine.
_ACCELERATOR_PLUGINS = ("cuda", "rocm", "xpu", "tpu")

logger = logging.getLogger("vllm_metal")


def register() -> str | None:
    """Return MetalPlatform's dotted path when this plugin should be active, else None."""
    from vllm_metal import envs

    mode = envs.VLLM_METAL_PLATFORM
    if mode == "off":
        return None
    if not _mlx_importable():
        if mode == "force":
            logger.warning("VLLM_METAL_PLATFORM=force but MLX cannot be imported; "
                           "run ./install.sh to set up the environment")
        return None
    if mode == "auto" and not _claims_machine():
        return None
    apply_process_defaults()
    return PLATFORM_QUALNAME


def _mlx_importable() -> bool:
    try:
        import mlx.core  # noqa: F401
    except Exception:  # a broken MLX install must not crash vLLM's plugin scan
        return False
    return True


def _claims_machine() -> bool:
    import mlx.core as mx

    if sys.platform == "darwin":
        return bool(mx.metal.is_available())
    if sys.platform.startswith("linux"):
        return not _other_accelerator_present()
    return False


def _other_accelerator_present() -> bool:
    try:
        from vllm.platforms import builtin_platform_plugins
    except Exception:
        return False
    for name in _ACCELERATOR_PLUGINS:
        probe = builtin_platform_plugins.get(name)
        if probe is None:
            continue
        try:
            if probe() is not None:
                return True
        except Exception:  # a probe that fails means that accelerator is absent
            continue
    return False


def apply_process_defaults() -> None:
    """Process-wide defaults that must be in place before vLLM starts workers.

    Idempotent; never overrides a value the user set.
    """
    # MLX's Metal backend commits a command buffer every N ops; 2000 keeps
    # long decode graphs from stalling on buffer turnover.
    os.environ.setdefault("MLX_MAX_OPS_PER_BUFFER", "2000")
    # The V2 model runner needs Triton, which this platform does not have.
    os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
    if sys.platform == "darwin":
        # Forked children of a process that touched Metal crash; spawn is safe.
        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        _set_start_method_spawn()
    _follow_vllm_log_level()


def _set_start_method_spawn() -> None:
    import multiprocessing

    if multiprocessing.get_start_method(allow_none=True) is None:
        multiprocessing.set_start_method("spawn")


def _follow_vllm_log_level() -> None:
    """Give ``vllm_metal`` vLLM's log level and send its records to vLLM's handlers.

    vLLM configures its handlers after plugins load (and again in each process),
    so they are looked up when a record is emitted, not copied now.
    """
    level = logging.getLevelName(os.environ.get("VLLM_LOGGING_LEVEL", "INFO").upper())
    logger.setLevel(level if isinstance(level, int) else logging.INFO)
    if not any(isinstance(h, _ForwardToVllm) for h in logger.handlers):
        logger.addHandler(_ForwardToVllm())


class _ForwardToVllm(logging.Handler):
    """Hands records to the ``vllm`` logger's handlers (vLLM's format and stream)."""

    def emit(self, record: logging.LogRecord) -> None:
        # Handlers on the root also get the record by propagation: never twice.
        propagated = set(logging.getLogger().handlers)
        for handler in logging.getLogger("vllm").handlers:
            if handler not in propagated and record.levelno >= handler.level:
                handler.handle(record)
