"""Every ``VLLM_METAL_*`` environment variable, declared once.

Values are read lazily on attribute access (``envs.VLLM_METAL_PLATFORM``), so a
variable set after import still takes effect. docs/configuration.md lists them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def _bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected a boolean (1/0/true/false), got {raw!r}")


def _auto_bool(raw: str) -> bool | None:
    """auto (or empty): None, the code decides; else a boolean."""
    if raw.strip().lower() in ("auto", ""):
        return None
    try:
        return _bool(raw)
    except ValueError:
        raise ValueError(f"expected auto, 1 or 0, got {raw!r}") from None


def _platform_mode(raw: str) -> str:
    value = raw.strip().lower()
    aliases = {"": "auto", "auto": "auto", "1": "force", "force": "force",
               "on": "force", "0": "off", "off": "off", "disable": "off"}
    if value not in aliases:
        raise ValueError(f"expected auto, force (1) or off (0), got {raw!r}")
    return aliases[value]


# KV cache dtypes the paged kernels store (auto: the model's dtype); also the
# --kv-cache-dtype values config_checks accepts.
KV_CACHE_DTYPES = ("auto", "float16", "bfloat16")


def _cache_dtype(raw: str) -> str:
    value = raw.strip().lower() or "auto"
    if value not in KV_CACHE_DTYPES:
        raise ValueError(f"expected one of {', '.join(KV_CACHE_DTYPES)}, got {raw!r}")
    return value


def _positive_int_or_zero(raw: str) -> int:
    value = int(raw)
    if value < 0:
        raise ValueError(f"expected an integer >= 0, got {raw!r}")
    return value


def _positive_float(raw: str) -> float:
    value = float(raw)
    if not value > 0:
        raise ValueError(f"expected a number > 0, got {raw!r}")
    return value


def _gdn_chunk(raw: str) -> int:
    value = int(raw.strip() or "0")
    if value not in (0, 32, 64):
        raise ValueError(f"expected 0, 32 or 64, got {raw!r}")
    return value


# MLX backends that carry hidden states between ranks (vllm_metal.distributed.group).
DISTRIBUTED_BACKENDS = ("ring", "jaccl")


def _distributed_backend(raw: str) -> str:
    value = raw.strip().lower() or "ring"
    if value not in DISTRIBUTED_BACKENDS:
        raise ValueError(f"expected one of {', '.join(DISTRIBUTED_BACKENDS)}, got {raw!r}")
    return value


@dataclass(frozen=True)
class EnvVar:
    default: str
    parse: Callable[[str], Any]
    doc: str


VARIABLES: dict[str, EnvVar] = {
    "VLLM_METAL_PLATFORM": EnvVar(
        "auto", _platform_mode,
        "auto: activate on Apple Silicon with Metal, or on Linux when no accelerator "
        "platform claims the machine; force (1): always activate; off (0): never."),
    "VLLM_METAL_CPU_DECODER_STACK": EnvVar(
        "1", _bool,
        "1: on the CPU backend, run the decoder layers of llama/mistral/qwen2/qwen3 "
        "models as one native node per step; 0: module by module (A/B)."),
    "VLLM_METAL_CPU_HUGE_PAGES": EnvVar(
        "1", _bool,
        "1: on the CPU backend (Linux), move the loaded weights onto transparent huge "
        "pages (fewer TLB misses while a decode step streams them) and move the "
        "zeroed KV cache onto huge pages; 0: leave both on the 4 KiB pages malloc "
        "gave them."),
    "VLLM_METAL_CPU_INT8_ACTIVATIONS": EnvVar(
        "auto", _auto_bool,
        "auto: on the CPU backend, a quantized model's 4/8-bit linear layers round their "
        "input to int8 per 32 columns and multiply in integers (AVX512-VNNI; 2-3x faster "
        "prefill and batched decode, ~1.5x single-stream, the trade llama.cpp makes), and "
        "its KV cache is float16; 1: the same; 0: fp32 activations and the model's dtype "
        "in the KV cache, mlx-lm's arithmetic up to summation order."),
    # Also read by the extension (csrc/cpu/runtime/isa.cpp) when it first multiplies.
    "VLLM_METAL_CPU_AMX": EnvVar(
        "1", _bool,
        "1: on x86 CPUs with AMX-INT8 (Sapphire Rapids on), int8-activation matmuls of "
        "16 rows or more (prefill, batched decode) multiply on AMX tiles, the same bits "
        "as AVX512-VNNI; 0: VNNI only (A/B)."),
    "VLLM_METAL_CPU_KV_CACHE_DTYPE": EnvVar(
        "auto", _cache_dtype,
        "CPU backend: float16 or bfloat16 stores keys and values in half precision while "
        "the model computes in float32 (vLLM's --kv-cache-dtype must match the model's "
        "dtype); auto: float16 when int8 activations run, else the model's dtype."),
    "VLLM_METAL_CPU_THREADS": EnvVar(
        "0", _positive_int_or_zero,
        "Threads of the extension's CPU kernel pool; 0 means one per hardware thread."),
    "VLLM_METAL_GDN_PREFILL_CHUNK": EnvVar(
        "0", _gdn_chunk,
        "32 or 64: hybrid models' Gated DeltaNet and Mamba2 layers run a prompt's rows in "
        "the chunked (matrix) form of their recurrence, chunks of that many rows from where "
        "the step starts (faster prefill; the rounding then depends on how the scheduler "
        "splits a prompt, so greedy output can differ alone and in a batch); 0: token by "
        "token, the same bits however the prompt is split."),
    "VLLM_METAL_DECODE_PIPELINE": EnvVar(
        "1", _bool,
        "Build step k+1's graph while step k runs; the host waits only when vLLM reads "
        "the output (0: wait inside sample_tokens)."),
    "VLLM_METAL_DISTRIBUTED_BACKEND": EnvVar(
        "ring", _distributed_backend,
        "MLX backend that carries hidden states between an engine's ranks "
        "(--pipeline-parallel-size): ring (TCP) or jaccl (RDMA over Thunderbolt 5 on "
        "Macs; needs MLX_IBV_DEVICES)."),
    "VLLM_METAL_TP_GATHER": EnvVar(
        "auto", _auto_bool,
        "With --tensor-parallel-size: 1 runs the output projections (o, down) whole on "
        "every rank, on all ranks' slices of their input gathered (greedy tokens are one "
        "rank's, bit for bit; the CPU decoder stack runs); 0 shards them and all-sums the "
        "partial products (each rank holds 1/N of every layer; rounding differs from one "
        "rank's). auto: 1 on the CPU backend, 0 on Metal."),
    "VLLM_METAL_GGUF_CACHE": EnvVar(
        "~/.cache/vllm-metal/gguf", str,
        "Where the config and tokenizer files derived from a GGUF's metadata are cached."),
    "VLLM_METAL_CPU_KV_CACHE_GIB": EnvVar(
        "4", _positive_float,
        "On the CPU backend, the most KV cache (GiB) the budget may allocate; "
        "--kv-cache-memory overrides it."),
    "VLLM_METAL_DEBUG_SYNC": EnvVar(
        "0", _bool,
        "Evaluate after every model forward (debugging aid; slower)."),
    # Also read by the extension's dispatch (csrc/dispatch/dispatch_env.cpp) on every
    # attention call, with the same accepted values, so it can be flipped for A/B runs.
    "VLLM_METAL_DISABLE_GQA_DECODE": EnvVar(
        "0", _bool,
        "1: decode batches never take the GQA decode kernel route "
        "(A/B against split-KV / varlen)."),
    "VLLM_METAL_BUILD_FROM_SOURCE": EnvVar(
        "0", _bool,
        "1: kernel development mode: rebuild stale artifacts from the source tree at load "
        "(macOS: JIT-compile kernels_v2/; Linux: rebuild the extension, recompile "
        "kernels_v2/ on the harness)."),
}


def _read(name: str) -> Any:
    var = VARIABLES[name]
    raw = os.environ.get(name, var.default)
    try:
        return var.parse(raw)
    except ValueError as exc:
        raise ValueError(f"invalid value for {name}: {exc}") from None


def __getattr__(name: str) -> Any:
    if name in VARIABLES:
        return _read(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(VARIABLES)
