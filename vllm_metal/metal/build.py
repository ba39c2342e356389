"""Kernel-developer build mode (VLLM_METAL_BUILD_FROM_SOURCE=1) on Linux.

Rebuilds the extension from the source tree when it is stale, with the one
build path (pip -> scikit-build-core -> CMake), and recompiles kernels_v2/ on
the MSL CPU harness (tools/msl_harness, cached by source hash), so a kernel
that no longer compiles fails at load.
"""

from __future__ import annotations

import fcntl
import logging
import subprocess
import sys
from pathlib import Path

logger = logging.getLogger("vllm_metal")


def rebuild_extension(root: Path) -> None:
    """`pip install --no-build-isolation --no-deps -e root`, one process at a time."""
    (root / "build").mkdir(exist_ok=True)
    with open(root / "build" / ".vllm_metal_rebuild.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # several vLLM processes may load at once
        logger.info("VLLM_METAL_BUILD_FROM_SOURCE=1: rebuilding the extension from %s", root)
        result = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "-e", str(root)],
            capture_output=True, text=True, check=False)
    if result.returncode:
        raise ImportError(f"rebuilding vllm_metal._ext failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")


def compile_on_harness(root: Path) -> int:
    """Compile every kernels_v2/*.metal on the harness; returns the number of kernels."""
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    from tools.msl_harness import compile_kernels

    libraries = compile_kernels(root / "kernels_v2", root / "build" / "msl_harness")
    return sum(len(lib.kernels) for lib in libraries.values())
