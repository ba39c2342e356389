"""The project's kernels_v2/ sources on the harness, with the shared kernel constants."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .library import MslLibrary

REPO = Path(__file__).resolve().parents[2]
KERNELS_DIR = REPO / "kernels_v2"
DEFAULT_CACHE = REPO / "build" / "msl_harness"


def kernel_defines() -> dict[str, str]:
    """The compile-time macros every kernel build gets, from vllm_metal/metal/constants.py."""
    from vllm_metal.metal import constants

    return {
        "VLLM_METAL_PARTITION_SIZE": str(constants.PARTITION_SIZE),
        "VLLM_METAL_KERNEL_BLOCK_SIZES": ",".join(str(b) for b in constants.KERNEL_BLOCK_SIZES),
    }


def compile_kernels(kernels_dir: str | os.PathLike = KERNELS_DIR,
                    cache_dir: str | os.PathLike = DEFAULT_CACHE,
                    jobs: int | None = None) -> dict[str, MslLibrary]:
    """Compile every .metal file of kernels_dir (in parallel); {file stem: library}."""
    paths = sorted(Path(kernels_dir).glob("*.metal"))
    defines = kernel_defines()
    with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
        libs = list(pool.map(lambda p: MslLibrary(p, defines, cache_dir), paths))
    return {p.stem: lib for p, lib in zip(paths, libs)}
