"""The native code: loader of the compiled extension ``vllm_metal._ext`` (the only
module that imports it, on every platform) and, on macOS, of its Metal kernels.

Checks at load (each failure is an ImportError that says what to do):
- MLX is exactly the version the extension was compiled against (private ABI);
- the compiled kernel constants equal vllm_metal/native/constants.py;
- the kernels_v2/ sources hash to the stamp the build recorded (no stale kernels).
Then, on macOS with Metal, it points the extension at the prebuilt .metallib files
(the main one, and the tensor-op one where the build made it) or, with
VLLM_METAL_BUILD_FROM_SOURCE=1, at kernels_v2/ to JIT-compile as two sources.

VLLM_METAL_BUILD_FROM_SOURCE=1 (source checkouts) first rebuilds a stale
extension (stamp, constants or MLX version differ) and, on Linux, recompiles
kernels_v2/ on the MSL CPU harness; see vllm_metal/native/build.py.
"""

from __future__ import annotations

import functools
import logging
import sys
from pathlib import Path
from types import ModuleType

from vllm_metal import envs
from vllm_metal.native import constants, kernel_sources

logger = logging.getLogger("vllm_metal")

METALLIB_NAME = "vllm_metal_kernels.metallib"
# Metal 4's tensor-op kernels (NaxPrefill): built only by a toolchain with Metal 4,
# so it may be absent (the route then stays off).
TENSOR_METALLIB_NAME = "vllm_metal_tensor_kernels.metallib"
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
            f"{built} but vllm_metal/native/constants.py says {source}; {_REBUILD_HINT}")


def check_kernels_stamp(built_hash: str, kernels_dir: Path | None) -> None:
    """Raise ImportError if kernels_v2/ changed since the extension (and metallib) was built."""
    if kernels_dir is None:
        return  # a wheel without sources: nothing to compare against
    current = kernel_sources.kernels_hash(kernels_dir)
    if current != built_hash:
        raise ImportError(
            f"stale kernels: {kernels_dir} hashes to {current[:12]} but the extension was built "
            f"from sources hashing to {built_hash[:12]}; {_REBUILD_HINT}, or set "
            f"VLLM_METAL_BUILD_FROM_SOURCE=1 to rebuild at load")


def _import_ext() -> ModuleType:
    try:
        from vllm_metal import _ext
    except ImportError as exc:
        raise ImportError(f"cannot import vllm_metal._ext ({exc}); {_REBUILD_HINT}") from exc
    return _ext


def _load_from_source() -> ModuleType:
    """VLLM_METAL_BUILD_FROM_SOURCE=1: rebuild a stale extension before importing it,
    and on Linux recompile kernels_v2/ on the MSL harness."""
    import mlx.core as mx

    from vllm_metal.native import build

    root = kernel_sources.source_tree()
    if root is None:
        raise ImportError("VLLM_METAL_BUILD_FROM_SOURCE=1 needs a vllm-metal source checkout "
                          "(an editable install); this one is installed from a wheel")
    loaded = sys.modules.get("vllm_metal._ext")
    if loaded is None:
        build.rebuild_if_stale(root, mx.__version__)  # probes in a child: this process stays clean
    else:
        # A module once imported stays: a rebuild could not take effect here.
        reason = build.stale_reason(build.extension_facts(loaded), root, mx.__version__)
        if reason is not None:
            raise ImportError(f"the extension is stale ({reason}) and already imported in this "
                              f"process, so a rebuild cannot take effect; {_REBUILD_HINT}")
    if sys.platform != "darwin":
        count = build.compile_on_harness(root)
        logger.info("kernels_v2 compiled on the MSL CPU harness (%d kernels)", count)
    return _import_ext()


def _configure_metal(ext: ModuleType, from_source: bool) -> str:
    """Point the extension at the Metal kernels; returns how they were loaded."""
    if from_source:
        directory = kernel_sources.kernels_dir()
        ext._set_metal_library_source(kernel_sources.metal_source(directory))
        tensor_source = kernel_sources.metal_source(directory, tensor_ops=True)
        if tensor_source:
            ext._set_metal_tensor_library_source(tensor_source)
        return f"JIT-compiled from {directory}"
    metallib = Path(ext.__file__).parent / METALLIB_NAME
    if not metallib.is_file():
        raise ImportError(f"{metallib} is missing (the build makes it next to the extension); "
                          f"{_REBUILD_HINT}")
    ext._set_metal_library_path(str(metallib))
    tensor_metallib = metallib.with_name(TENSOR_METALLIB_NAME)
    if not tensor_metallib.is_file():
        return f"prebuilt {metallib.name}"
    ext._set_metal_tensor_library_path(str(tensor_metallib))
    return f"prebuilt {metallib.name} and {tensor_metallib.name}"


@functools.cache
def get_ops() -> ModuleType:
    """The checked extension module (cached; logs once when first loaded)."""
    import mlx.core as mx

    from_source = envs.VLLM_METAL_BUILD_FROM_SOURCE
    ext = _load_from_source() if from_source else _import_ext()
    check_mlx_version(ext.mlx_build_version, mx.__version__)
    check_constants(ext)
    check_kernels_stamp(ext.kernels_hash, kernel_sources.kernels_dir(Path(ext.__file__).parent))
    if sys.platform == "darwin" and mx.metal.is_available():
        how = _configure_metal(ext, from_source)
        logger.info("Native paged-attention Metal kernels loaded (%s, %d GPU cores)", how,
                    ext.gpu_core_count())
    else:
        logger.info("Native paged-attention CPU kernels loaded (%s%s, %d threads)",
                    ext.cpu_isa(), " with AMX tiles" if ext.cpu_amx() else "",
                    ext.cpu_threads())
    return ext
