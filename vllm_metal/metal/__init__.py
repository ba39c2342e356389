"""Loader of the native extension: the only module that imports ``vllm_metal._ext``.

The extension links MLX's C++ API, which has no stable ABI, so it refuses to
run against any MLX other than the one it was compiled with.
"""

from __future__ import annotations

import functools
import logging
from types import ModuleType

from vllm_metal.metal import constants

logger = logging.getLogger("vllm_metal")

_REBUILD_HINT = (
    "rebuild the extension: `pip install --no-build-isolation .` from the "
    "vllm-metal source tree (or reinstall vllm-metal)"
)


def check_mlx_version(built_against: str, running: str) -> None:
    """Raise ImportError unless the running MLX is the one the extension was built for."""
    if built_against != running:
        raise ImportError(
            f"vllm_metal._ext was built against MLX {built_against} but MLX {running} "
            f"is installed; {_REBUILD_HINT}")


def check_constants(ext: ModuleType) -> None:
    """Raise ImportError if the extension's compiled constants are stale."""
    built = (ext.PARTITION_SIZE, tuple(ext.KERNEL_BLOCK_SIZES))
    source = (constants.PARTITION_SIZE, tuple(constants.KERNEL_BLOCK_SIZES))
    if built != source:
        raise ImportError(
            f"vllm_metal._ext was compiled with (PARTITION_SIZE, KERNEL_BLOCK_SIZES) = "
            f"{built} but vllm_metal/metal/constants.py says {source}; {_REBUILD_HINT}")


@functools.cache
def get_ops() -> ModuleType:
    """The checked extension module (cached; logs once when first loaded)."""
    import mlx.core as mx

    try:
        from vllm_metal import _ext
    except ImportError as exc:
        raise ImportError(f"cannot import vllm_metal._ext ({exc}); {_REBUILD_HINT}") from exc
    check_mlx_version(_ext.mlx_build_version, mx.__version__)
    check_constants(_ext)
    logger.info("Native paged-attention CPU kernels loaded (%s, %d threads)",
                _ext.cpu_isa(), _ext.cpu_threads())
    return _ext
