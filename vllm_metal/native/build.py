"""Kernel-developer build mode (VLLM_METAL_BUILD_FROM_SOURCE=1).

Decides whether the installed extension is stale against the source tree
without importing it here (a process cannot load a rebuilt extension once it
has imported the old one), rebuilds it with the one build path (pip ->
scikit-build-core -> CMake, which on macOS also rebuilds the .metallib), and
on Linux recompiles kernels_v2/ on the MSL CPU harness (cached by source
hash), so a kernel that no longer compiles fails at load.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from vllm_metal.native import constants, kernel_sources

logger = logging.getLogger("vllm_metal")

# Run in a child process: prints the facts of the installed extension as JSON.
_PROBE = (
    "import json\n"
    "from vllm_metal import _ext\n"
    "from vllm_metal.native.build import extension_facts\n"
    "print(json.dumps(extension_facts(_ext)))\n"
)


def extension_facts(ext: ModuleType) -> dict:
    """What the extension was built from: kernels_v2 stamp, kernel constants, MLX version."""
    return {
        "kernels_hash": ext.kernels_hash,
        "partition_size": int(ext.PARTITION_SIZE),
        "block_sizes": [int(b) for b in ext.KERNEL_BLOCK_SIZES],
        "mlx_version": ext.mlx_build_version,
    }


def probe_extension() -> dict | None:
    """extension_facts of the installed extension, read in a child process; None if it does not import."""
    # The child sees this process's sys.path, so it finds the same vllm_metal.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    result = subprocess.run([sys.executable, "-P", "-c", _PROBE], env=env, capture_output=True, text=True,
                            check=False, timeout=600)
    if result.returncode:
        logger.info("the installed extension does not import: %s", result.stderr.strip()[-500:])
        return None
    return json.loads(result.stdout.strip().splitlines()[-1])


def stale_reason(facts: dict | None, root: Path, mlx_version: str) -> str | None:
    """Why an extension with these facts must be rebuilt from `root`, or None if it is current."""
    if facts is None:
        return "the extension is missing or does not import"
    if facts["mlx_version"] != mlx_version:
        return f"it was built against MLX {facts['mlx_version']}, MLX {mlx_version} is installed"
    if (facts["partition_size"], facts["block_sizes"]) != (constants.PARTITION_SIZE,
                                                          list(constants.KERNEL_BLOCK_SIZES)):
        return "vllm_metal/native/constants.py changed"
    if facts["kernels_hash"] != kernel_sources.kernels_hash(root / "kernels_v2"):
        return "kernels_v2/ changed"
    return None


def rebuild_if_stale(root: Path, mlx_version: str) -> str | None:
    """Rebuild the installed extension from `root` if it is stale; returns why, or None.

    The check runs under a lock shared by every process loading at once (a vLLM
    server starts several), so the first one rebuilds and the others find it current.
    """
    (root / "build").mkdir(exist_ok=True)
    with open(root / "build" / ".vllm_metal_rebuild.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        reason = stale_reason(probe_extension(), root, mlx_version)
        if reason is not None:
            logger.info("VLLM_METAL_BUILD_FROM_SOURCE=1: rebuilding the extension from %s (%s)", root, reason)
            rebuild_extension(root)
    return reason


def rebuild_extension(root: Path) -> None:
    """`pip install --no-build-isolation --no-deps -e root` (CMake rebuilds only what changed)."""
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
