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
    """The compile-time macros every kernel build gets, from vllm_metal/native/constants.py
    (the same function builds them for the macOS JIT source)."""
    from vllm_metal.native import kernel_sources

    return kernel_sources.constant_defines()


def compile_kernels(kernels_dir: str | os.PathLike = KERNELS_DIR,
                    cache_dir: str | os.PathLike = DEFAULT_CACHE,
                    jobs: int | None = None) -> dict[str, MslLibrary]:
    """Compile every .metal file of kernels_dir (in parallel); {file stem: library}."""
    paths = sorted(Path(kernels_dir).glob("*.metal"))
    defines = kernel_defines()
    with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
        libs = list(pool.map(lambda p: MslLibrary(p, defines, cache_dir), paths))
    return {p.stem: lib for p, lib in zip(paths, libs)}
